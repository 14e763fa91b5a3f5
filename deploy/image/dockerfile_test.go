package main

// A reader of the Dockerfile instructions that make an image's config, enough to compare
// deploy/Dockerfile's stages with what this package builds: stages, ARG and ENV with Docker's
// variable substitution ($V, ${V}, ${V:-word}, ${V:+word}), quoting and line continuations,
// and USER, WORKDIR, ENV, LABEL, EXPOSE, VOLUME, STOPSIGNAL, ENTRYPOINT and CMD (exec form).
// Instructions that set config this package does not build (HEALTHCHECK, ONBUILD, SHELL) are
// errors, so that adding one to the Dockerfile fails the comparison instead of slipping by.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// dockerfile is a parsed Dockerfile.
type dockerfile struct {
	args   []instr // the ARG instructions before the first FROM
	stages []*stage
}

// stage is one FROM and the instructions up to the next.
type stage struct {
	name, base, platform string
	line                 int
	instrs               []instr
}

// instr is one instruction: its keyword in upper case and the rest of its logical line.
type instr struct {
	line int
	cmd  string
	args string
}

func parseDockerfileFile(file string) (*dockerfile, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	d, err := parseDockerfile(string(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return d, nil
}

func parseDockerfile(text string) (*dockerfile, error) {
	d := &dockerfile{}
	var cur strings.Builder
	start, inside := 0, false
	lines := strings.Split(text, "\n")
	for i, raw := range lines {
		trimmed := strings.TrimSpace(raw)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue // comments and blank lines, also inside a continued instruction
		}
		if !inside {
			start, inside = i+1, true
			cur.Reset()
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(trimmed)
		inside = false
		keyword, rest, _ := strings.Cut(cur.String(), " ")
		in := instr{line: start, cmd: strings.ToUpper(keyword), args: strings.TrimSpace(rest)}
		if err := d.add(in); err != nil {
			return nil, fmt.Errorf("line %d: %w", in.line, err)
		}
	}
	if inside {
		return nil, fmt.Errorf("line %d: the instruction continues past the end of the file", start)
	}
	return d, nil
}

func (d *dockerfile) add(in instr) error {
	if in.cmd != "FROM" {
		switch {
		case len(d.stages) > 0:
			s := d.stages[len(d.stages)-1]
			s.instrs = append(s.instrs, in)
		case in.cmd == "ARG":
			d.args = append(d.args, in)
		default:
			return fmt.Errorf("%s before the first FROM", in.cmd)
		}
		return nil
	}
	s := &stage{line: in.line}
	f := strings.Fields(in.args)
	for len(f) > 0 && strings.HasPrefix(f[0], "--") {
		if v, ok := strings.CutPrefix(f[0], "--platform="); ok {
			s.platform = v
		}
		f = f[1:]
	}
	switch {
	case len(f) == 1:
	case len(f) == 3 && strings.EqualFold(f[1], "AS"):
		s.name = strings.ToLower(f[2])
	default:
		return fmt.Errorf("FROM %s: want FROM [--platform=P] IMAGE [AS NAME]", in.args)
	}
	s.base = f[0]
	d.stages = append(d.stages, s)
	return nil
}

// stage returns the stage named name, or nil.
func (d *dockerfile) stage(name string) *stage {
	for _, s := range d.stages {
		if s.name == name {
			return s
		}
	}
	return nil
}

// globalArgs are the defaults of the ARGs before the first FROM, with the build args given.
func (d *dockerfile) globalArgs(buildArgs map[string]string) (map[string]string, error) {
	vars := map[string]string{}
	for _, in := range d.args {
		if err := declareArgs(in.args, vars, buildArgs); err != nil {
			return nil, fmt.Errorf("line %d: ARG: %w", in.line, err)
		}
	}
	return vars, nil
}

// base is the stage's base image with the global ARGs substituted.
func (d *dockerfile) base(s *stage, buildArgs map[string]string) (string, error) {
	vars, err := d.globalArgs(buildArgs)
	if err != nil {
		return "", err
	}
	return expand(s.base, vars)
}

// config is the image config that the stage's own instructions declare, build args
// substituted. The base image's config is not included: a stage on another stage is an error.
func (d *dockerfile) config(name string, buildArgs map[string]string) (v1.Config, error) {
	s := d.stage(name)
	if s == nil {
		return v1.Config{}, fmt.Errorf("no stage %q", name)
	}
	if d.stage(strings.ToLower(s.base)) != nil {
		return v1.Config{}, fmt.Errorf("line %d: stage %q is built on stage %q, whose config this reader does not follow", s.line, name, s.base)
	}
	var c v1.Config
	vars := map[string]string{}
	cmdSet := false
	for _, in := range s.instrs {
		err := func() error {
			switch in.cmd {
			case "ARG":
				return declareArgs(in.args, vars, buildArgs)
			case "ENV":
				kvs, err := keyValues(in.args, vars, true)
				if err != nil {
					return err
				}
				for _, kv := range kvs {
					vars[kv[0]] = kv[1]
					c.Env = setEnv(c.Env, kv[0], kv[1])
				}
			case "LABEL":
				kvs, err := keyValues(in.args, vars, false)
				if err != nil {
					return err
				}
				for _, kv := range kvs {
					if c.Labels == nil {
						c.Labels = map[string]string{}
					}
					c.Labels[kv[0]] = kv[1]
				}
			case "USER":
				v, err := expand(in.args, vars)
				c.User = v
				return err
			case "WORKDIR":
				v, err := expand(in.args, vars)
				if !path.IsAbs(v) {
					v = path.Join("/", c.WorkingDir, v)
				}
				c.WorkingDir = v
				return err
			case "EXPOSE", "VOLUME":
				var words []string
				var err error
				if in.cmd == "VOLUME" && strings.HasPrefix(in.args, "[") {
					err = json.Unmarshal([]byte(in.args), &words)
				} else {
					words, err = shellWords(in.args, vars)
				}
				if err != nil {
					return err
				}
				for _, w := range words {
					if in.cmd == "VOLUME" {
						if c.Volumes == nil {
							c.Volumes = map[string]struct{}{}
						}
						c.Volumes[w] = struct{}{}
						continue
					}
					if !strings.Contains(w, "/") {
						w += "/tcp"
					}
					if c.ExposedPorts == nil {
						c.ExposedPorts = map[string]struct{}{}
					}
					c.ExposedPorts[strings.ToLower(w)] = struct{}{}
				}
			case "STOPSIGNAL":
				v, err := expand(in.args, vars)
				c.StopSignal = v
				return err
			case "ENTRYPOINT", "CMD":
				var argv []string
				if err := json.Unmarshal([]byte(in.args), &argv); err != nil {
					return fmt.Errorf("%s %s: only the exec form (a JSON array) works on an image without a shell", in.cmd, in.args)
				}
				if in.cmd == "CMD" {
					c.Cmd, cmdSet = argv, true
				} else {
					c.Entrypoint = argv
					if !cmdSet {
						c.Cmd = nil // as Docker does: an ENTRYPOINT resets the CMD the stage did not set
					}
				}
			case "HEALTHCHECK", "ONBUILD", "SHELL", "MAINTAINER":
				return fmt.Errorf("%s changes the image config, and deploy/image does not build it", in.cmd)
			}
			return nil
		}()
		if err != nil {
			return v1.Config{}, fmt.Errorf("line %d: %s: %w", in.line, in.cmd, err)
		}
	}
	return c, nil
}

// declareArgs handles `ARG NAME[=default] ...`: a build arg given wins over the default.
func declareArgs(args string, vars, buildArgs map[string]string) error {
	words, err := shellWords(args, vars)
	if err != nil {
		return err
	}
	for _, w := range words {
		name, def, _ := strings.Cut(w, "=")
		if v, ok := buildArgs[name]; ok {
			def = v
		}
		vars[name] = def
	}
	return nil
}

// keyValues parses `k=v k2="v 2"` (and, for ENV, the old `KEY value with spaces`).
func keyValues(args string, vars map[string]string, env bool) ([][2]string, error) {
	words, err := shellWords(args, vars)
	if err != nil {
		return nil, err
	}
	if len(words) == 0 {
		return nil, fmt.Errorf("nothing to set")
	}
	if env && !strings.Contains(words[0], "=") {
		key, rest, _ := strings.Cut(args, " ")
		v, err := expand(strings.TrimSpace(rest), vars)
		return [][2]string{{key, v}}, err
	}
	kvs := make([][2]string, 0, len(words))
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want KEY=VALUE", w)
		}
		kvs = append(kvs, [2]string{k, v})
	}
	return kvs, nil
}

// setEnv sets KEY=VALUE in an image's Env list, replacing an earlier value.
func setEnv(env []string, key, value string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			env[i] = key + "=" + value
			return env
		}
	}
	return append(env, key+"="+value)
}

// shellWords splits s into words as Docker does for these instructions: unquoted white space
// separates, "double quotes" substitute variables and take \" and \\, 'single quotes' are
// literal, and a backslash outside quotes escapes the next character.
func shellWords(s string, vars map[string]string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ' in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i, inWord = i+1+j, true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				switch {
				case s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\' || s[i+1] == '$'):
					i++
					w.WriteByte(s[i])
				case s[i] == '$':
					v, n, err := variable(s[i:], vars)
					if err != nil {
						return nil, err
					}
					w.WriteString(v)
					i += n - 1
				default:
					w.WriteByte(s[i])
				}
			}
			if i >= len(s) {
				return nil, fmt.Errorf(`unterminated " in %q`, s)
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case c == '$':
			v, n, err := variable(s[i:], vars)
			if err != nil {
				return nil, err
			}
			w.WriteString(v)
			i, inWord = i+n-1, true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// expand substitutes variables in s, which is not split or unquoted (USER, WORKDIR, FROM).
func expand(s string, vars map[string]string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && s[i+1] == '$':
			i++
			b.WriteByte('$')
		case s[i] == '$':
			v, n, err := variable(s[i:], vars)
			if err != nil {
				return "", err
			}
			b.WriteString(v)
			i += n - 1
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), nil
}

// variable reads the reference at the start of s ($NAME, ${NAME}, ${NAME:-word},
// ${NAME:+word}) and returns its value and its length in s. An unset variable is empty.
func variable(s string, vars map[string]string) (string, int, error) {
	isName := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	if len(s) > 1 && s[1] == '{' {
		end := strings.IndexByte(s, '}')
		if end < 0 {
			return "", 0, fmt.Errorf("unterminated ${ in %q", s)
		}
		body := s[2:end]
		name, word, op := body, "", ""
		if i := strings.Index(body, ":"); i >= 0 {
			name, op, word = body[:i], body[i:min(i+2, len(body))], body[min(i+2, len(body)):]
		}
		for i := 0; i < len(name); i++ {
			if !isName(name[i]) {
				return "", 0, fmt.Errorf("${%s}: only ${NAME}, ${NAME:-word} and ${NAME:+word} are read here", body)
			}
		}
		v, set := vars[name]
		switch op {
		case "":
		case ":-":
			if v == "" {
				v = word
			}
		case ":+":
			if set && v != "" {
				v = word
			} else {
				v = ""
			}
		default:
			return "", 0, fmt.Errorf("${%s}: only ${NAME}, ${NAME:-word} and ${NAME:+word} are read here", body)
		}
		return v, end + 1, nil
	}
	n := 1
	for n < len(s) && isName(s[n]) {
		n++
	}
	if n == 1 {
		return "$", 1, nil
	}
	return vars[s[1:n]], n, nil
}

// configDiff lists how the Dockerfile's config and the image's differ, one line per field or
// label; empty when they agree.
func configDiff(docker, image v1.Config) []string {
	var diffs []string
	field := func(name string, d, i any) {
		if !reflect.DeepEqual(d, i) {
			diffs = append(diffs, fmt.Sprintf("%s: Dockerfile %s, image %s", name, show(d), show(i)))
		}
	}
	field("USER", docker.User, image.User)
	field("ENTRYPOINT", docker.Entrypoint, image.Entrypoint)
	field("CMD", docker.Cmd, image.Cmd)
	field("ENV", docker.Env, image.Env)
	field("WORKDIR", docker.WorkingDir, image.WorkingDir)
	field("EXPOSE", keys(docker.ExposedPorts), keys(image.ExposedPorts))
	field("VOLUME", keys(docker.Volumes), keys(image.Volumes))
	field("STOPSIGNAL", docker.StopSignal, image.StopSignal)
	all := map[string]bool{}
	for k := range docker.Labels {
		all[k] = true
	}
	for k := range image.Labels {
		all[k] = true
	}
	for _, k := range keys(all) {
		d, inD := docker.Labels[k]
		i, inI := image.Labels[k]
		switch {
		case !inI:
			diffs = append(diffs, fmt.Sprintf("LABEL %s: only in the Dockerfile", k))
		case !inD:
			diffs = append(diffs, fmt.Sprintf("LABEL %s: only in the image", k))
		case d != i:
			diffs = append(diffs, fmt.Sprintf("LABEL %s: Dockerfile %q, image %q", k, d, i))
		}
	}
	return diffs
}

func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// keys are a map's keys, sorted; nil for an empty map.
func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestDockerfileDrift shows that the comparison TestImage makes between deploy/Dockerfile and
// the image fails when they differ: each fixture is the `sluice` stage with changes, compared
// with the config this package builds.
func TestDockerfileDrift(t *testing.T) {
	buildArgs := map[string]string{"VERSION": testVersion, "REVISION": testRevision}
	tests := []struct {
		file    string
		want    []string // the differences, in configDiff's order
		wantErr string
	}{
		{file: "testdata/Dockerfile.same", want: nil},
		{file: "testdata/Dockerfile.drift", want: []string{
			`USER: Dockerfile "nonroot", image "65532:65532"`,
			`CMD: Dockerfile ["serve","--config","/etc/sluice/gateway.yaml"], image ["serve","--config","/etc/sluice/sluice.yaml"]`,
			`ENV: Dockerfile ["PATH=/usr/local/bin","SSL_CERT_DIR=/etc/ssl/certs"], image ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]`,
			`WORKDIR: Dockerfile "/srv/sluice", image "/"`,
			`EXPOSE: Dockerfile ["8080/tcp","9090/udp"], image ["8080/tcp","9090/tcp"]`,
			`VOLUME: Dockerfile ["/var/lib/sluice"], image null`,
			`LABEL org.opencontainers.image.revision: only in the image`,
			`LABEL org.opencontainers.image.vendor: only in the Dockerfile`,
			`LABEL org.opencontainers.image.version: Dockerfile "", image "1.2.3-test"`,
		}},
		{file: "testdata/Dockerfile.shellform", wantErr: "only the exec form"},
		{file: "testdata/Dockerfile.healthcheck", wantErr: "HEALTHCHECK changes the image config"},
		{file: "testdata/Dockerfile.nostage", wantErr: `no stage "sluice"`},
	}
	for _, tt := range tests {
		t.Run(path.Base(tt.file), func(t *testing.T) {
			d, err := parseDockerfileFile(tt.file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.config("sluice", buildArgs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("config: error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			diffs := configDiff(got, imageConfig(testVersion, testRevision))
			if !reflect.DeepEqual(diffs, tt.want) {
				t.Errorf("differences:\n  %s\nwant:\n  %s", strings.Join(diffs, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

// TestShellWords covers the quoting and substitution the comparison relies on.
func TestShellWords(t *testing.T) {
	vars := map[string]string{"V": "1.2", "E": ""}
	tests := []struct {
		in   string
		want []string
	}{
		{`a=b c="d e"`, []string{"a=b", "c=d e"}},
		{`v=$V w=${V} x="${V}-x" y='$V'`, []string{"v=1.2", "w=1.2", "x=1.2-x", "y=$V"}},
		{`a=${E:-dflt} b=${V:-dflt} c=${V:+set} d=${E:+set} e=${UNSET}`, []string{"a=dflt", "b=1.2", "c=set", "d=", "e="}},
		{`q="say \"hi\"" p=a\ b d=\$V`, []string{`q=say "hi"`, "p=a b", "d=$V"}},
		{`  8080   9090/udp `, []string{"8080", "9090/udp"}},
	}
	for _, tt := range tests {
		got, err := shellWords(tt.in, vars)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("shellWords(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{`a="b`, `a='b`, `a=${V`, `a=${V%%x}`} {
		if _, err := shellWords(bad, vars); err == nil {
			t.Errorf("shellWords(%q): no error", bad)
		}
	}
}

// TestDockerfile checks what deploy/Dockerfile declares beyond the `sluice` stage's config
// (which TestImage compares with the image): the stages, the Go version against go.mod's, the
// go build flags against this package's, the `sluice-gpu` stage's config against the
// `sluice` stage's, and that .dockerignore lets through every file the builds read.
func TestDockerfile(t *testing.T) {
	d, err := parseDockerfileFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range d.stages {
		names = append(names, s.name)
	}
	// sluice last: a build without --target makes the static image.
	if want := []string{"rootfs", "build", "build-gpu", "sluice-gpu", "sluice"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("stages %q, want %q", names, want)
	}

	t.Run("bases", func(t *testing.T) {
		gomod, err := os.ReadFile("../../go.mod")
		if err != nil {
			t.Fatal(err)
		}
		goMinor := ""
		for _, line := range strings.Split(string(gomod), "\n") {
			if v, ok := strings.CutPrefix(line, "go "); ok {
				parts := strings.SplitN(strings.TrimSpace(v), ".", 3)
				goMinor = strings.Join(parts[:min(2, len(parts))], ".")
			}
		}
		want := map[string]string{
			"rootfs":     "golang:" + goMinor + "-bookworm",
			"build":      "golang:" + goMinor + "-bookworm",
			"build-gpu":  "golang:" + goMinor + "-bookworm",
			"sluice-gpu": "gcr.io/distroless/base-debian12:nonroot", // bookworm's glibc, as build-gpu links against
			"sluice":     "scratch",
		}
		for _, s := range d.stages {
			base, err := d.base(s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if base != want[s.name] {
				t.Errorf("stage %s is built on %q, want %q (go.mod says go %s)", s.name, base, want[s.name], goMinor)
			}
		}
	})

	t.Run("go build flags", func(t *testing.T) {
		tests := []struct {
			stage string
			want  []string
		}{
			{"build", []string{"CGO_ENABLED=0", "GOARCH=${TARGETARCH}"}},
			{"build-gpu", []string{"CGO_ENABLED=1", "-tags nvml"}},
		}
		for _, tt := range tests {
			var build string
			for _, in := range d.stage(tt.stage).instrs {
				if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
					build = in.args
				}
			}
			if build == "" {
				t.Errorf("stage %s runs no go build", tt.stage)
				continue
			}
			// This package's flags, with the Dockerfile's ${VERSION} for the version.
			want := append(slices.Clone(tt.want), "-trimpath", "-buildvcs=false", `-ldflags "`+ldflags("${VERSION}")+`"`, "./cmd/sluice")
			for _, w := range want {
				if !strings.Contains(build, w) {
					t.Errorf("stage %s: go build lacks %s:\n%s", tt.stage, w, build)
				}
			}
		}
	})

	t.Run("sluice-gpu like sluice", func(t *testing.T) {
		args := map[string]string{"VERSION": testVersion, "REVISION": testRevision}
		static, err := d.config("sluice", args)
		if err != nil {
			t.Fatal(err)
		}
		withGPU, err := d.config("sluice-gpu", args)
		if err != nil {
			t.Fatal(err)
		}
		// The same but for the title and description, and the NVIDIA toolkit's capabilities.
		static.Labels["org.opencontainers.image.title"] = "sluice-gpu"
		static.Labels["org.opencontainers.image.description"] = withGPU.Labels["org.opencontainers.image.description"]
		static.Env = append([]string{"NVIDIA_DRIVER_CAPABILITIES=utility"}, static.Env...)
		if diffs := configDiff(withGPU, static); len(diffs) > 0 {
			t.Errorf("sluice-gpu (\"Dockerfile\") and sluice (\"image\") differ:\n  %s", strings.Join(diffs, "\n  "))
		}
	})

	t.Run(".dockerignore", func(t *testing.T) {
		data, err := os.ReadFile("../../.dockerignore")
		if err != nil {
			t.Fatal(err)
		}
		var patterns []string
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				patterns = append(patterns, line)
			}
		}
		if len(patterns) == 0 || patterns[0] != "*" {
			t.Fatalf(".dockerignore %q: want an allow list, * first", patterns)
		}
		var allow []string
		for _, p := range patterns[1:] {
			a, ok := strings.CutPrefix(p, "!")
			if !ok {
				t.Fatalf(".dockerignore: %q after *: this test reads only ! lines there", p)
			}
			allow = append(allow, a)
		}
		// What the builds read: the COPY sources from the context, and every file of the
		// module's packages that the two go builds compile or embed.
		need := []string{}
		for _, s := range d.stages {
			for _, in := range s.instrs {
				if in.cmd == "COPY" && !strings.Contains(in.args, "--from=") {
					f := strings.Fields(in.args)
					for _, src := range f[:len(f)-1] {
						if src != "." {
							need = append(need, src)
						}
					}
				}
			}
		}
		for _, tags := range []string{"", "nvml"} {
			need = append(need, moduleFiles(t, tags)...)
		}
		for _, p := range need {
			if !allowed(p, allow) {
				t.Errorf("%s: the Docker build reads it, and .dockerignore keeps it out of the context", p)
			}
		}
	})
}

// allowed reports whether the allow list of a .dockerignore (its ! lines) lets path through:
// the forms used there are a path, a directory ending in /, and **/GLOB.
func allowed(p string, allow []string) bool {
	for _, a := range allow {
		switch {
		case strings.HasPrefix(a, "**/"):
			if ok, _ := path.Match(a[3:], path.Base(p)); ok {
				return true
			}
		case strings.HasSuffix(a, "/"):
			if strings.HasPrefix(p, a) || p+"/" == a {
				return true
			}
		default:
			if ok, _ := path.Match(a, p); ok {
				return true
			}
		}
	}
	return false
}

// moduleFiles are the files, relative to the module's root, of the module's own packages that
// `go build -tags TAGS ./cmd/sluice` reads: Go and C sources and embedded files.
func moduleFiles(t *testing.T, tags string) []string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-tags="+tags, "-json=Dir,Module,GoFiles,CgoFiles,CFiles,HFiles,SFiles,SysoFiles,EmbedFiles", "./cmd/sluice")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var files []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Dir                                                              string
			Module                                                           *struct{ Main bool }
			GoFiles, CgoFiles, CFiles, HFiles, SFiles, SysoFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		for _, list := range [][]string{p.GoFiles, p.CgoFiles, p.CFiles, p.HFiles, p.SFiles, p.SysoFiles, p.EmbedFiles} {
			for _, f := range list {
				rel, err := filepath.Rel(root, filepath.Join(p.Dir, f))
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, filepath.ToSlash(rel))
			}
		}
	}
	if len(files) == 0 {
		t.Fatal("go list found no file of the module")
	}
	return files
}
