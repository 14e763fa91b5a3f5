package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sluicegw/sluice/gpu"
)

const (
	testVersion  = "1.2.3-test"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	testEpoch    = 1700000000 // 2023-11-14T22:13:20Z
)

// shippedConfigEnv is the environment each config shipped in the image needs to pass
// `sluice check` (and to start). A config added to rootfs/etc/sluice must be added here: the
// test fails until it is.
var shippedConfigEnv = map[string][]string{
	"etc/sluice/sluice.yaml": {"SLUICE_ADMIN_TOKEN=test-admin-token"},
}

// testBuilder is this package's command, built once per test run and without the race
// detector, under which the image's gzip and digests would take minutes.
var testBuilder struct {
	dir  string
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-image-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testBuilder.dir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// requireTool skips the test when something it needs from the host is missing, or fails it
// when SLUICE_REQUIRE_TOOLS=1 (CI sets it where the tools must be there).
func requireTool(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("SLUICE_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%s: %v (SLUICE_REQUIRE_TOOLS=1)", what, err)
	}
	t.Skipf("%s: %v (set SLUICE_REQUIRE_TOOLS=1 to fail instead)", what, err)
}

// hostCanRun skips the test unless this host runs the image's binaries.
func hostCanRun(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		t.Skipf("the image is for linux/amd64 and linux/arm64, and this host is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
}

// buildImage runs `go run ./deploy/image` (its binary) with the test's version, revision,
// epoch and this host's architecture, then extra, and returns what it printed.
func buildImage(t *testing.T, out string, extra ...string) string {
	t.Helper()
	hostCanRun(t)
	if _, err := os.Stat(defaultCABundle); err != nil {
		requireTool(t, "the CA bundle of Debian's ca-certificates", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	testBuilder.once.Do(func() {
		testBuilder.path = filepath.Join(testBuilder.dir, "image")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", testBuilder.path, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			testBuilder.err = fmt.Errorf("go build ./deploy/image: %w\n%s", err, out)
		}
	})
	if testBuilder.err != nil {
		t.Fatal(testBuilder.err)
	}
	args := append([]string{"--out", out, "--version", testVersion, "--revision", testRevision,
		"--arch", runtime.GOARCH, "--source-date-epoch", strconv.Itoa(testEpoch)}, extra...)
	cmd := exec.CommandContext(ctx, testBuilder.path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run ./deploy/image %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// readLayout reads the layout's only image, as a registry client would: through index.json.
func readLayout(t *testing.T, dir string) (v1.Descriptor, v1.Image) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1 (crane push takes a layout of one image)", len(im.Manifests))
	}
	desc := im.Manifests[0]
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return desc, img
}

// imageFile is a file of the image's file system.
type imageFile struct {
	hdr   *tar.Header
	data  []byte
	layer int
}

// imageFiles reads every layer of the image, and fails the test on what the image must not
// hold: whiteouts, and a path in two layers.
func imageFiles(t *testing.T, img v1.Image) map[string]imageFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]imageFile{}
	for i, l := range layers {
		rc := uncompressed(t, l)
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %d: %v", i, err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("layer %d: %s: %v", i, h.Name, err)
			}
			name := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/"), "/")
			if strings.Contains(name, ".wh.") {
				t.Errorf("layer %d: whiteout %s", i, h.Name)
			}
			if f, dup := files[name]; dup {
				t.Errorf("%s is in layers %d and %d", name, f.layer, i)
			}
			files[name] = imageFile{hdr: h, data: data, layer: i}
		}
		if err := rc.Close(); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
	}
	return files
}

// uncompressed is the layer's tar stream. Under the race detector, which CI uses, Go's
// inflate takes about 8 s for the binary's layer and gzip(1) a tenth of that, so gzip(1)
// decompresses where the host has it.
func uncompressed(t *testing.T, l v1.Layer) io.ReadCloser {
	t.Helper()
	if _, err := exec.LookPath("gzip"); err != nil {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		return rc
	}
	blob, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("gzip", "-dc")
	cmd.Stdin = blob
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return gunzipStream{out, cmd, blob, &stderr}
}

// gunzipStream is gzip -dc's output; Close waits for it.
type gunzipStream struct {
	io.Reader
	cmd    *exec.Cmd
	blob   io.Closer
	stderr *bytes.Buffer
}

func (g gunzipStream) Close() error {
	_, _ = io.Copy(io.Discard, g.Reader) // the rest, so that gzip can finish
	err := g.cmd.Wait()
	_ = g.blob.Close()
	if err != nil {
		return fmt.Errorf("gzip -dc: %w: %s", err, g.stderr.String())
	}
	return nil
}

// cleanEnv is this process's environment without Sluice's variables, plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// runBinary runs bin with args and env and returns its output and exit status.
func runBinary(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		code = ee.ExitCode()
	default:
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, e.String())
	}
	return o.String(), e.String(), code
}

// gpuReport is what `sluice gpu --json` prints, the part these tests read.
type gpuReport struct {
	NVML struct {
		Available bool              `json:"available"`
		Error     string            `json:"error"`
		Devices   []json.RawMessage `json:"devices"`
	} `json:"nvml"`
}

// TestImage builds the image into a temporary directory and checks it reading only the OCI
// layout: the index, the config (and that it is what deploy/Dockerfile's `sluice` stage
// declares), the files, the binary taken from its layer (`sluice version`, `sluice check` on
// every config shipped, `sluice gpu`, static linking), and that the same inputs give the same
// digest.
func TestImage(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "layout")
	report := buildImage(t, dir) // it builds the binary: the only go build of sluice in TestImage
	desc, img := readLayout(t, dir)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("layout", func(t *testing.T) {
		tag := testVersion
		checks := []struct {
			what      string
			got, want any
		}{
			{"manifest media type", desc.MediaType, types.OCIManifestSchema1},
			{"config media type", manifest.Config.MediaType, types.OCIConfigJSON},
			{"ref.name annotation", desc.Annotations[refNameAnnotation], tag},
			{"containerd name annotation", desc.Annotations[containerdNameAnnotation], defaultRepo + ":" + tag},
			{"platform", fmt.Sprint(desc.Platform), fmt.Sprint(&v1.Platform{OS: "linux", Architecture: runtime.GOARCH, Variant: variant(runtime.GOARCH)})},
			{"layers", len(manifest.Layers), 2},
		}
		for _, c := range checks {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
			}
		}
		for i, l := range manifest.Layers {
			if l.MediaType != types.OCILayer {
				t.Errorf("layer %d: media type %s, want %s", i, l.MediaType, types.OCILayer)
			}
		}
		for _, want := range []string{desc.Digest.String(), "crane push " + dir, "skopeo copy oci:" + dir + ":" + tag} {
			if !strings.Contains(report, want) {
				t.Errorf("the report does not say %q:\n%s", want, report)
			}
		}
	})

	t.Run("config", func(t *testing.T) {
		c := cf.Config
		checks := []struct {
			what      string
			got, want any
		}{
			{"entrypoint", c.Entrypoint, []string{"/usr/local/bin/sluice"}},
			{"cmd", c.Cmd, []string{"serve", "--config", "/etc/sluice/sluice.yaml"}},
			{"user", c.User, "65532:65532"},
			{"exposed ports", keys(c.ExposedPorts), []string{"8080/tcp", "9090/tcp"}},
			{"working dir", c.WorkingDir, "/"},
			{"env", c.Env, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
			{"label title", c.Labels["org.opencontainers.image.title"], "sluice"},
			{"label source", c.Labels["org.opencontainers.image.source"], "https://github.com/sluicegw/sluice"},
			{"label version", c.Labels["org.opencontainers.image.version"], testVersion},
			{"label revision", c.Labels["org.opencontainers.image.revision"], testRevision},
			{"label description set", c.Labels["org.opencontainers.image.description"] != "", true},
			{"labels", len(c.Labels), 5},
			{"os", cf.OS, "linux"},
			{"architecture", cf.Architecture, runtime.GOARCH},
			{"created", cf.Created.UTC(), time.Unix(testEpoch, 0).UTC()},
			{"history entries", len(cf.History), 2},
			{"diff ids", len(cf.RootFS.DiffIDs), 2},
		}
		for _, ch := range checks {
			if !reflect.DeepEqual(ch.got, ch.want) {
				t.Errorf("%s: %#v, want %#v", ch.what, ch.got, ch.want)
			}
		}
		for i, h := range cf.History {
			if !h.Created.Equal(time.Unix(testEpoch, 0)) || h.CreatedBy == "" {
				t.Errorf("history %d: %+v: want created at the epoch and a created_by", i, h)
			}
		}
	})

	t.Run("same as the Dockerfile", func(t *testing.T) {
		d, err := parseDockerfileFile("../Dockerfile")
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.config("sluice", map[string]string{"VERSION": testVersion, "REVISION": testRevision})
		if err != nil {
			t.Fatal(err)
		}
		if diffs := configDiff(want, cf.Config); len(diffs) > 0 {
			t.Errorf("deploy/Dockerfile's sluice stage and the image differ (change both):\n  %s", strings.Join(diffs, "\n  "))
		}
	})

	files := imageFiles(t, img)
	bin := filepath.Join(t.TempDir(), "sluice")
	if f, ok := files[binaryPath]; !ok {
		t.Fatalf("the image has no /%s", binaryPath)
	} else if err := os.WriteFile(bin, f.data, 0o755); err != nil {
		t.Fatal(err)
	}

	t.Run("files", func(t *testing.T) {
		host, err := os.ReadFile(defaultCABundle)
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			path  string
			typ   byte
			mode  int64
			layer int
			check func(data []byte) error
		}{
			{"usr/local/bin/sluice", tar.TypeReg, 0o755, 1, nil},
			{"usr/local/bin", tar.TypeDir, 0o755, 1, nil},
			{"etc/ssl/certs/ca-certificates.crt", tar.TypeReg, 0o644, 0, func(data []byte) error {
				if !bytes.Equal(data, host) {
					return fmt.Errorf("not the build host's %s", defaultCABundle)
				}
				return nil
			}},
			{"etc/passwd", tar.TypeReg, 0o644, 0, hasLine("nonroot:x:65532:65532:")},
			{"etc/group", tar.TypeReg, 0o644, 0, hasLine("nonroot:x:65532:")},
			{"etc/sluice/sluice.yaml", tar.TypeReg, 0o644, 0, nil},
			{"tmp", tar.TypeDir, 0o1777, 0, nil},
		}
		for _, tt := range tests {
			f, ok := files[tt.path]
			if !ok {
				t.Errorf("/%s is missing", tt.path)
				continue
			}
			if f.hdr.Typeflag != tt.typ || f.hdr.Mode != tt.mode || f.layer != tt.layer {
				t.Errorf("/%s: type %q mode %#o in layer %d, want type %q mode %#o in layer %d",
					tt.path, f.hdr.Typeflag, f.hdr.Mode, f.layer, tt.typ, tt.mode, tt.layer)
			}
			if tt.check != nil {
				if err := tt.check(f.data); err != nil {
					t.Errorf("/%s: %v", tt.path, err)
				}
			}
		}
		// The user can change nothing: everything is root's, and only /tmp is writable by others.
		for name, f := range files {
			h := f.hdr
			if h.Uid != 0 || h.Gid != 0 {
				t.Errorf("/%s is owned by %d:%d, want 0:0", name, h.Uid, h.Gid)
			}
			if h.Mode&0o6000 != 0 || (h.Mode&0o002 != 0 && name != "tmp") {
				t.Errorf("/%s has mode %#o: no setuid, setgid or world-writable file belongs in the image", name, h.Mode)
			}
			if !h.ModTime.Equal(time.Unix(testEpoch, 0)) {
				t.Errorf("/%s is modified at %v, want the epoch", name, h.ModTime)
			}
			if dir := filepath.Dir(name); dir != "." && files[dir].hdr == nil {
				t.Errorf("/%s: its directory /%s is not in the image", name, dir)
			}
		}
		// The CMD serves a config the image has.
		if i := slices.Index(cf.Config.Cmd, "--config"); i < 0 || i+1 >= len(cf.Config.Cmd) {
			t.Errorf("CMD %q names no --config", cf.Config.Cmd)
		} else if _, ok := files[strings.TrimPrefix(cf.Config.Cmd[i+1], "/")]; !ok {
			t.Errorf("CMD serves %s, which the image does not have", cf.Config.Cmd[i+1])
		}
	})

	t.Run("static binary", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("program header %v: the binary is dynamically linked", p.Type)
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("DT_NEEDED %v (%v): want none", libs, err)
		}
		if want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]; f.Machine != want {
			t.Errorf("machine %v, want %v", f.Machine, want)
		}
	})

	t.Run("sluice version", func(t *testing.T) {
		out, errOut, code := runBinary(t, bin, cleanEnv(), "version")
		if code != 0 || out != "sluice "+testVersion+"\n" {
			t.Errorf("sluice version: exit %d, %q (stderr %q); want exit 0 and %q", code, out, errOut, "sluice "+testVersion+"\n")
		}
	})

	t.Run("sluice check", func(t *testing.T) {
		etc := filepath.Join(t.TempDir(), "etc-sluice")
		if err := os.MkdirAll(etc, 0o755); err != nil {
			t.Fatal(err)
		}
		var shipped []string
		for name, f := range files {
			if strings.HasPrefix(name, "etc/sluice/") && f.hdr.Typeflag == tar.TypeReg {
				shipped = append(shipped, name)
				if err := os.WriteFile(filepath.Join(etc, filepath.Base(name)), f.data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		slices.Sort(shipped)
		if want := keys(shippedConfigEnv); !reflect.DeepEqual(shipped, want) {
			t.Fatalf("the image ships %q, and shippedConfigEnv lists %q: list each config with the env it needs", shipped, want)
		}
		for _, name := range shipped {
			file := filepath.Join(etc, filepath.Base(name))
			out, errOut, code := runBinary(t, bin, cleanEnv(shippedConfigEnv[name]...), "check", "--config", file)
			if code != 0 || !strings.Contains(out, ": ok (") {
				t.Errorf("sluice check /%s: exit %d\n%s%s", name, code, out, errOut)
			}
			// Each variable listed is needed: without it, check refuses the config and says why.
			for _, kv := range shippedConfigEnv[name] {
				key, _, _ := strings.Cut(kv, "=")
				env := slices.DeleteFunc(slices.Clone(shippedConfigEnv[name]), func(s string) bool { return s == kv })
				_, errOut, code := runBinary(t, bin, cleanEnv(env...), "check", "--config", file)
				if code != 1 || !strings.Contains(errOut, key) {
					t.Errorf("sluice check /%s without %s: exit %d, stderr %q; want exit 1 naming %s", name, key, code, errOut, key)
				}
			}
		}
	})

	t.Run("sluice gpu", func(t *testing.T) {
		out, errOut, code := runBinary(t, bin, cleanEnv(), "gpu", "--json")
		var rep gpuReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
			t.Fatalf("sluice gpu --json: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		if rep.NVML.Available || !strings.Contains(rep.NVML.Error, gpu.ErrUnavailable.Error()) {
			t.Errorf("the static build's NVML: %+v, want unavailable with %q", rep.NVML, gpu.ErrUnavailable)
		}
	})

	t.Run("reproducible", func(t *testing.T) {
		// The binary taken from the image is given back (--binary): building it again is Go's
		// reproducible build, and relinking it would only make the test slower.
		tests := []struct {
			name  string
			extra []string
			same  bool
		}{
			{"same inputs, another directory", nil, true},
			{"another epoch", []string{"--source-date-epoch", strconv.Itoa(testEpoch + 1)}, false},
		}
		first, err := os.ReadFile(filepath.Join(dir, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range tests {
			out := filepath.Join(t.TempDir(), "layout")
			buildImage(t, out, append([]string{"--binary", bin}, tt.extra...)...)
			again, _ := readLayout(t, out)
			if same := again.Digest == desc.Digest; same != tt.same {
				t.Errorf("%s: digest %s, first %s; want the same: %v", tt.name, again.Digest, desc.Digest, tt.same)
			}
			index, err := os.ReadFile(filepath.Join(out, "index.json"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.same && !bytes.Equal(index, first) {
				t.Errorf("%s: index.json differs:\n%s\nfirst:\n%s", tt.name, index, first)
			}
		}
	})
}

// hasLine checks that a file has the line that starts with prefix.
func hasLine(prefix string) func([]byte) error {
	return func(data []byte) error {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, prefix) {
				return nil
			}
		}
		return fmt.Errorf("no line %q…:\n%s", prefix, data)
	}
}

// TestRun checks the command line's errors, each found before anything is built.
func TestRun(t *testing.T) {
	tmp := t.TempDir()
	notLayout := filepath.Join(tmp, "not-a-layout")
	if err := os.MkdirAll(notLayout, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(notLayout, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	noCerts := filepath.Join(tmp, "empty.pem")
	if err := os.WriteFile(noCerts, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "out")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		epoch   string // SOURCE_DATE_EPOCH
		code    int
		wantErr string
	}{
		{"help", []string{"--help"}, "", 0, "usage: go run ./deploy/image"},
		{"no out", nil, "", 2, "--out DIR is required"},
		{"argument", []string{"--out", out, "extra"}, "", 2, `unexpected argument "extra"`},
		{"arch", []string{"--out", out, "--arch", "riscv64"}, "", 2, "want amd64 or arm64"},
		{"version not a tag", []string{"--out", out, "--version", "1.0.0+build.5"}, "", 2, "pass --tag"},
		{"empty version", []string{"--out", out, "--version", ""}, "", 2, "--version must not be empty"},
		{"bad repo", []string{"--out", out, "--repo", "Not A Repo"}, "", 2, "image name"},
		{"bad epoch flag", []string{"--out", out, "--source-date-epoch", "yesterday"}, "", 2, "want Unix seconds"},
		{"bad SOURCE_DATE_EPOCH", []string{"--out", out}, "-5", 2, "SOURCE_DATE_EPOCH"},
		{"out not a layout", []string{"--out", notLayout}, "", 2, "is not an OCI image layout"},
		{"no CA bundle", []string{"--out", out, "--ca-bundle", filepath.Join(tmp, "missing.crt")}, "", 1, "apt-get install ca-certificates"},
		{"CA bundle without certificates", []string{"--out", out, "--ca-bundle", noCerts}, "", 1, "holds no PEM certificate"},
		{"not the sluice binary", []string{"--out", out, "--binary", self}, "", 1, "binary " + self},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SOURCE_DATE_EPOCH", tt.epoch)
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("run %q: exit %d, stderr %q; want exit %d and %q", tt.args, code, stderr.String(), tt.code, tt.wantErr)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("run %q wrote %s", tt.args, out)
			}
		})
	}
	if data, err := os.ReadFile(filepath.Join(notLayout, "notes.txt")); err != nil || string(data) != "mine" {
		t.Errorf("a directory that is not a layout was changed: %q, %v", data, err)
	}
}
