package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"embed"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	modulePath      = "github.com/sluicegw/sluice"
	defaultRepo     = "ghcr.io/sluicegw/sluice"
	defaultCABundle = "/etc/ssl/certs/ca-certificates.crt"

	// Paths in the image, without the leading slash as in a layer's tar.
	binaryPath   = "usr/local/bin/sluice"
	caBundlePath = "etc/ssl/certs/ca-certificates.crt"

	// nonroot is the image's user and group: distroless's nonroot, numeric so that
	// Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
	nonroot = "65532:65532"

	// Annotations of the image's entry in the layout's index.json.
	refNameAnnotation        = "org.opencontainers.image.ref.name" // the tag (skopeo's oci:DIR:TAG)
	containerdNameAnnotation = "io.containerd.image.name"          // the full name (docker load, ctr import)
)

// rootfs holds the files of the image besides the binary and the CA bundle: the configs of
// /etc/sluice and the nonroot user's /etc/passwd and /etc/group. deploy/Dockerfile copies the
// same directory.
//
//go:embed rootfs
var rootfs embed.FS

// options are the inputs of a build; the same options give the same image digest.
type options struct {
	Out      string // the OCI image layout directory
	Version  string // main.version and the version label
	Revision string // the revision label; "": git rev-parse HEAD, else "unknown"
	Arch     string // amd64 or arm64
	Tag      string // the ref.name annotation; "": Version
	Repo     string // the repository of the io.containerd.image.name annotation
	CABundle string // the PEM bundle shipped as /etc/ssl/certs/ca-certificates.crt

	// Epoch is the time of every timestamp in the image; nil: the commit time of HEAD, else
	// the Unix epoch. EpochFrom says where a non-nil Epoch came from, for the report.
	Epoch     *time.Time
	EpochFrom string

	Src    string    // the module's root; "": found with `go env GOMOD`
	Binary string    // a binary built as buildBinary builds it (checkBinary checks); "": build one
	Log    io.Writer // the report; nil: none
}

// usageError is a wrong option (run exits 2 on it rather than 1).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// result is what build wrote.
type result struct {
	Digest v1.Hash // the image manifest's digest
	Ref    string  // Repo:Tag
	Size   int64   // manifest, config and compressed layers
}

// build makes the image described by opts and writes it to opts.Out as an OCI image layout.
func build(ctx context.Context, opts options) (result, error) {
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	if err := opts.check(); err != nil {
		return result{}, err
	}
	ca, ncerts, err := readCABundle(opts.CABundle)
	if err != nil {
		return result{}, err
	}
	if opts.Src == "" {
		if opts.Src, err = moduleRoot(ctx); err != nil {
			return result{}, err
		}
	}
	if opts.Revision == "" {
		opts.Revision = "unknown"
		if rev, err := gitOutput(ctx, opts.Src, "rev-parse", "HEAD"); err == nil && rev != "" {
			opts.Revision = rev
		}
	}
	if opts.Epoch == nil {
		t, from := time.Unix(0, 0).UTC(), "no SOURCE_DATE_EPOCH and no git commit"
		if ct, err := gitOutput(ctx, opts.Src, "log", "-1", "--format=%ct"); err == nil {
			if sec, err := strconv.ParseInt(ct, 10, 64); err == nil {
				t, from = time.Unix(sec, 0).UTC(), "the commit time of HEAD"
			}
		}
		opts.Epoch, opts.EpochFrom = &t, from
	}
	epoch := *opts.Epoch

	bin := opts.Binary
	if bin == "" {
		dir, err := os.MkdirTemp("", "sluice-image-")
		if err != nil {
			return result{}, fmt.Errorf("temporary directory for the binary: %w", err)
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "sluice")
		fmt.Fprintf(log, "building /%s for linux/%s: CGO_ENABLED=0 go %s\n", binaryPath, opts.Arch,
			strings.Join(quoteArgs(goBuildArgs(opts.Version, bin)), " "))
		if err := buildBinary(ctx, opts.Src, opts.Arch, opts.Version, bin); err != nil {
			return result{}, err
		}
	}
	if err := checkBinary(ctx, bin, opts.Arch, opts.Version); err != nil {
		return result{}, err
	}
	binData, err := os.ReadFile(bin)
	if err != nil {
		return result{}, fmt.Errorf("reading the binary: %w", err)
	}

	baseEntries, err := rootfsEntries(ca)
	if err != nil {
		return result{}, err
	}
	base, err := newLayer(baseEntries, epoch)
	if err != nil {
		return result{}, fmt.Errorf("the /etc and /tmp layer: %w", err)
	}
	binLayer, err := newLayer([]entry{
		{name: "usr/", mode: 0o755}, {name: "usr/local/", mode: 0o755}, {name: "usr/local/bin/", mode: 0o755},
		{name: binaryPath, mode: 0o755, data: binData},
	}, epoch)
	if err != nil {
		return result{}, fmt.Errorf("the binary's layer: %w", err)
	}

	cf := &v1.ConfigFile{
		Architecture: opts.Arch,
		OS:           "linux",
		Variant:      variant(opts.Arch),
		Created:      v1.Time{Time: epoch},
		Config:       imageConfig(opts.Version, opts.Revision),
		RootFS:       v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(empty.Image, cf)
	if err != nil {
		return result{}, fmt.Errorf("image config: %w", err)
	}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "deploy/image: /etc/sluice, /etc/passwd, /etc/group, /" + caBundlePath + " (" + strconv.Itoa(ncerts) + " certificates), /tmp",
		}},
		mutate.Addendum{Layer: binLayer, MediaType: types.OCILayer, History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "deploy/image: /" + binaryPath + " (CGO_ENABLED=0 GOOS=linux GOARCH=" + opts.Arch + " go " + strings.Join(quoteArgs(goBuildArgs(opts.Version, "sluice")), " ") + ")",
		}})
	if err != nil {
		return result{}, fmt.Errorf("adding the layers: %w", err)
	}
	img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)

	ref := opts.Repo + ":" + opts.Tag
	platform := v1.Platform{OS: "linux", Architecture: opts.Arch, Variant: variant(opts.Arch)}
	if err := writeLayout(opts.Out, img, map[string]string{refNameAnnotation: opts.Tag, containerdNameAnnotation: ref}, platform); err != nil {
		return result{}, err
	}

	res := result{Ref: ref}
	if res.Digest, err = img.Digest(); err != nil {
		return result{}, fmt.Errorf("image digest: %w", err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return result{}, fmt.Errorf("image manifest: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return result{}, fmt.Errorf("image manifest: %w", err)
	}
	res.Size = int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		res.Size += l.Size
	}
	fmt.Fprintf(log, "wrote %s: OCI image layout of %s, linux/%s\n", opts.Out, ref, opts.Arch)
	fmt.Fprintf(log, "  image   %s  %s in all\n", res.Digest, mib(res.Size))
	fmt.Fprintf(log, "  layer   %s  %s  /etc (configs, user 65532, %d CA certificates from %s), /tmp\n", m.Layers[0].Digest, mib(m.Layers[0].Size), ncerts, opts.CABundle)
	fmt.Fprintf(log, "  layer   %s  %s  /%s (%s uncompressed)\n", m.Layers[1].Digest, mib(m.Layers[1].Size), binaryPath, mib(int64(len(binData))))
	fmt.Fprintf(log, "  version %s, revision %s, timestamps %s (%s)\n", opts.Version, opts.Revision, epoch.Format(time.RFC3339), opts.EpochFrom)
	fmt.Fprintf(log, "push it with: crane push %s %s\n          or: skopeo copy oci:%s:%s docker://%s\n", opts.Out, ref, opts.Out, opts.Tag, ref)
	return res, nil
}

// check validates the options that need no file and no build, and fills in the defaults
// that depend only on the others.
func (o *options) check() error {
	if o.Out == "" {
		return usageError{errors.New("--out DIR is required")}
	}
	if o.Arch != "amd64" && o.Arch != "arm64" {
		return usageError{fmt.Errorf("--arch %q: want amd64 or arm64", o.Arch)}
	}
	if o.Version == "" {
		return usageError{errors.New("--version must not be empty (`sluice version` prints it)")}
	}
	if o.Tag == "" {
		o.Tag = o.Version
	}
	if o.Repo == "" {
		o.Repo = defaultRepo
	}
	if _, err := name.NewTag(o.Repo+":"+o.Tag, name.StrictValidation); err != nil {
		return usageError{fmt.Errorf("image name %s:%s: %w (a tag is at most 128 of [A-Za-z0-9_.-] and does not start with . or -; pass --tag when the version is not one)", o.Repo, o.Tag, err)}
	}
	return checkOut(o.Out)
}

// imageConfig is the config of the image: the same as deploy/Dockerfile's `sluice` stage
// declares (TestImage compares them).
func imageConfig(version, revision string) v1.Config {
	return v1.Config{
		User:         nonroot,
		Entrypoint:   []string{"/" + binaryPath},
		Cmd:          []string{"serve", "--config", "/etc/sluice/sluice.yaml"},
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		WorkingDir:   "/",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "9090/tcp": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "sluice",
			"org.opencontainers.image.description": "Sluice, an inference gateway for OpenAI-compatible model servers",
			"org.opencontainers.image.source":      "https://github.com/sluicegw/sluice",
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.revision":    revision,
		},
	}
}

// variant is the platform variant docker buildx gives the architecture.
func variant(arch string) string {
	if arch == "arm64" {
		return "v8"
	}
	return ""
}

// ldflags are the linker flags of the binary, as deploy/Dockerfile passes them.
func ldflags(version string) string {
	return "-s -w -X main.version=" + version
}

// goBuildArgs is the go command that builds the binary to out (with CGO_ENABLED=0, GOOS=linux).
func goBuildArgs(version, out string) []string {
	return []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags(version), "-o", out, "./cmd/sluice"}
}

// buildBinary cross-builds ./cmd/sluice of the module at src into out, with the go command on
// PATH and its normal build cache.
func buildBinary(ctx context.Context, src, arch, version, out string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the go command is needed to build the binary: %w", err)
	}
	cmd := exec.CommandContext(ctx, gobin, goBuildArgs(version, out)...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for linux/%s: %w\n%s", arch, err, strings.TrimSpace(output.String()))
	}
	return nil
}

// checkBinary makes sure that the binary is what the image needs and what buildBinary makes:
// a static Linux executable for arch, built from ./cmd/sluice with CGO_ENABLED=0 and -trimpath
// (its Go build info says so), whose `sluice version` is version (run where this host can run
// it; elsewhere the version must at least be in the binary).
func checkBinary(ctx context.Context, path, arch, version string) error {
	if err := checkStaticELF(path, arch); err != nil {
		return err
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("binary %s: %w", path, err)
	}
	if want := modulePath + "/cmd/sluice"; info.Path != want {
		return fmt.Errorf("binary %s is %s, not %s", path, info.Path, want)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for key, want := range map[string]string{"CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": arch, "-trimpath": "true"} {
		if settings[key] != want {
			return fmt.Errorf("binary %s was built with %s=%q, not %s=%s (build it as go run ./deploy/image does)", path, key, settings[key], key, want)
		}
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != arch {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("binary %s: %w", path, err)
		}
		if !bytes.Contains(data, []byte(version)) {
			return fmt.Errorf("binary %s does not hold the version %q: build it with -ldflags \"%s\"", path, version, ldflags(version))
		}
		return nil
	}
	out, err := exec.CommandContext(ctx, path, "version").Output()
	if err != nil {
		return fmt.Errorf("%s version: %w", path, err)
	}
	if got, want := strings.TrimSpace(string(out)), "sluice "+version; got != want {
		return fmt.Errorf("%s version prints %q, not %q: build it with -ldflags \"%s\"", path, got, want, ldflags(version))
	}
	return nil
}

// checkStaticELF makes sure the binary runs on the empty base: a Linux executable for arch
// with no program interpreter and no shared libraries.
func checkStaticELF(path, arch string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("binary %s: %w", path, err)
	}
	defer f.Close()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != want {
		return fmt.Errorf("binary %s is for %v, not %s", path, f.Machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("binary %s is dynamically linked (it has a program interpreter): the image has no libc", path)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("binary %s: %w", path, err)
	}
	if len(libs) > 0 {
		return fmt.Errorf("binary %s needs shared libraries %v: the image has none", path, libs)
	}
	return nil
}

// readCABundle reads a PEM CA bundle and counts its certificates; a missing, unreadable or
// certificate-less bundle is an error that says what to install.
func readCABundle(path string) ([]byte, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("CA bundle: %w: install Debian's ca-certificates (apt-get install ca-certificates), or pass --ca-bundle FILE with a PEM bundle", err)
	}
	n := 0
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return nil, 0, fmt.Errorf("CA bundle %s: certificate %d: %w", path, n+1, err)
		}
		n++
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("CA bundle %s holds no PEM certificate: install Debian's ca-certificates (apt-get install ca-certificates), or pass --ca-bundle FILE", path)
	}
	return data, n, nil
}

// entry is a file or directory of a layer.
type entry struct {
	name string // relative to /, a directory's ending in "/"
	mode int64  // permission bits, and 01000 (sticky) for /tmp
	data []byte
}

// rootfsEntries are the first layer's files: rootfs/ (directories 0755, files 0644), the CA
// bundle and /tmp (1777), all owned by root so that the user 65532 can change none of them.
func rootfsEntries(ca []byte) ([]entry, error) {
	var es []entry
	err := fs.WalkDir(rootfs, "rootfs", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, "rootfs"), "/")
		switch {
		case rel == "":
			return nil
		case d.IsDir():
			es = append(es, entry{name: rel + "/", mode: 0o755})
		case d.Type().IsRegular():
			data, err := rootfs.ReadFile(p)
			if err != nil {
				return err
			}
			es = append(es, entry{name: rel, mode: 0o644, data: data})
		default:
			return fmt.Errorf("%s: only files and directories belong in rootfs", p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	seen := map[string]bool{}
	for _, e := range es {
		seen[e.name] = true
	}
	if seen[caBundlePath] || seen["tmp/"] {
		return nil, fmt.Errorf("rootfs must hold neither %s (it comes from --ca-bundle) nor tmp", caBundlePath)
	}
	for _, e := range []entry{
		{name: "etc/", mode: 0o755}, {name: "etc/ssl/", mode: 0o755}, {name: "etc/ssl/certs/", mode: 0o755},
		{name: caBundlePath, mode: 0o644, data: ca},
		{name: "tmp/", mode: 0o1777},
	} {
		if !seen[e.name] {
			es = append(es, e)
		}
	}
	return es, nil
}

// newLayer makes an OCI layer (gzip) of the entries, sorted by name, each owned by root and
// modified at mtime: the same entries and mtime give the same digest.
func newLayer(entries []entry, mtime time.Time) (v1.Layer, error) {
	entries = append([]entry(nil), entries...)
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name: e.name, Mode: e.mode, ModTime: mtime, Uname: "root", Gname: "root",
			Typeflag: tar.TypeReg, Size: int64(len(e.data)),
		}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("%s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("%s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
}

// checkOut refuses an --out that exists and is neither empty nor an OCI image layout, so that
// replacing it loses nothing but an earlier image.
func checkOut(out string) error {
	ents, err := os.ReadDir(out)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--out %s: %w", out, err)
	case len(ents) == 0:
		return nil
	}
	if _, err := os.Stat(filepath.Join(out, "oci-layout")); err != nil {
		return usageError{fmt.Errorf("--out %s exists and is not an OCI image layout (no oci-layout file): not replacing it", out)}
	}
	return nil
}

// writeLayout writes the image as the only entry of a new OCI image layout at out, replacing
// an existing layout there only once the new one is complete.
func writeLayout(out string, img v1.Image, annotations map[string]string, platform v1.Platform) error {
	if err := checkOut(out); err != nil {
		return err
	}
	parent := filepath.Dir(filepath.Clean(out))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("--out %s: %w", out, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return fmt.Errorf("--out %s: %w", out, err)
	}
	defer os.RemoveAll(tmp) // after the rename there is nothing left to remove
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(annotations), layout.WithPlatform(platform)); err != nil {
		return fmt.Errorf("writing the image to the layout: %w", err)
	}
	// The layout is written 0777 less the umask, and MkdirTemp made its root 0700: make it
	// readable by all and writable by its owner only, as a directory of blobs should be.
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	})
	if err != nil {
		return fmt.Errorf("writing the layout: %w", err)
	}
	if err := os.RemoveAll(out); err != nil {
		return fmt.Errorf("replacing %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("replacing %s: %w", out, err)
	}
	return nil
}

// moduleRoot is the root of the sluice module the working directory is in.
func moduleRoot(ctx context.Context) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	path := strings.TrimSpace(string(gomod))
	data, err := os.ReadFile(path)
	if path == "" || path == os.DevNull || err != nil {
		return "", fmt.Errorf("not inside the %s module: run it from the repository (go run ./deploy/image)", modulePath)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			if f[1] != modulePath {
				return "", fmt.Errorf("%s is module %s, not %s: run it from Sluice's repository", path, f[1], modulePath)
			}
			return filepath.Dir(path), nil
		}
	}
	return "", fmt.Errorf("%s has no module line", path)
}

// gitOutput runs git in dir and returns its trimmed output.
func gitOutput(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// defaultArch is the host's architecture where the image supports it, else amd64.
func defaultArch() string {
	if runtime.GOARCH == "arm64" {
		return "arm64"
	}
	return "amd64"
}

// quoteArgs quotes the arguments that hold spaces, for printing a command line.
func quoteArgs(args []string) []string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if strings.ContainsAny(a, " \t\"") {
			q[i] = strconv.Quote(a)
		}
	}
	return q
}

// mib formats a size in MiB.
func mib(n int64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
