package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// glibcLibraries are the shared libraries of glibc, which distroless base has and nothing else
// in the sluice-gpu image provides.
var glibcLibraries = []string{
	"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libresolv.so.2",
	"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}

// TestGPUVariant checks the two builds from source: the default one compiles no C outside the
// standard library (so `go build` and `go run` print nothing but Sluice's own output), and the
// nvml one (`CGO_ENABLED=1 go build -tags nvml`, the sluice-gpu image's binary) links NVML's
// package, needs nothing but glibc, and runs without a GPU: `sluice gpu` says NVML is
// unavailable and exits 0.
func TestGPUVariant(t *testing.T) {
	t.Parallel()
	hostCanRun(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	goCmd := func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	t.Run("cgo packages", func(t *testing.T) {
		tests := []struct {
			tags string
			want []string // the module's and its dependencies' packages with cgo files
		}{
			{"", nil},
			{"nvml", []string{"github.com/NVIDIA/go-nvml/pkg/dl", "github.com/NVIDIA/go-nvml/pkg/nvml"}},
		}
		for _, tt := range tests {
			out, err := goCmd(ctx, "list", "-deps", "-tags="+tt.tags, "-f", "{{if and .CgoFiles (not .Standard)}}{{.ImportPath}}{{end}}", "./cmd/sluice").Output()
			if err != nil {
				t.Fatalf("go list -tags=%s: %v", tt.tags, err)
			}
			got := strings.Fields(string(out))
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("-tags=%q: packages with cgo %q, want %q", tt.tags, got, tt.want)
			}
		}
	})

	cc, err := goCmd(ctx, "env", "CC").Output()
	if err != nil {
		t.Fatal(err)
	}
	compiler := strings.Fields(string(cc))
	if len(compiler) == 0 {
		compiler = []string{"gcc"}
	}
	if _, err := exec.LookPath(compiler[0]); err != nil {
		requireTool(t, "a C compiler for the nvml build", err)
	}
	bin := filepath.Join(t.TempDir(), "sluice-gpu")
	build := goCmd(ctx, "build", "-tags", "nvml", "-o", bin, "./cmd/sluice")
	var buildOut bytes.Buffer
	build.Stdout, build.Stderr = &buildOut, &buildOut
	if err := build.Run(); err != nil {
		t.Fatalf("CGO_ENABLED=1 go build -tags nvml ./cmd/sluice: %v\n%s", err, buildOut.String())
	}

	t.Run("links glibc only", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		interp := false
		for _, p := range f.Progs {
			interp = interp || p.Type == elf.PT_INTERP
		}
		if !interp {
			t.Errorf("no program interpreter: a cgo build should be dynamically linked against glibc")
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range libs {
			if !slices.Contains(glibcLibraries, l) {
				// libnvidia-ml.so.1 in particular: go-nvml opens it with dlopen, so that the
				// binary starts on a node without the driver.
				t.Errorf("DT_NEEDED %s: only glibc's libraries are in the image", l)
			}
		}
	})

	t.Run("sluice gpu without a GPU", func(t *testing.T) {
		out, errOut, code := runBinary(t, bin, cleanEnv(), "gpu", "--json")
		var rep gpuReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
			t.Fatalf("sluice gpu --json: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		if rep.NVML.Available {
			t.Logf("NVML is available on this host: %d devices", len(rep.NVML.Devices))
			return
		}
		// The nvml build tried the driver (the default build's stub would say it has no NVML).
		if !strings.Contains(rep.NVML.Error, "NVML unavailable") || strings.Contains(rep.NVML.Error, "this build has no NVML") {
			t.Errorf("NVML error %q: want the driver's absence, from the nvml build", rep.NVML.Error)
		}
		text, errOut, code := runBinary(t, bin, cleanEnv(), "gpu")
		if code != 0 || !strings.HasPrefix(text, "NVML unavailable: ") {
			t.Errorf("sluice gpu: exit %d, %q (stderr %q); want exit 0 and a line saying NVML is unavailable", code, text, errOut)
		}
	})
}
