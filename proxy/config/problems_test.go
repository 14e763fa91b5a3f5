package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestLoadReportsEveryProblem: a file with several mistakes (unknown keys in two sections,
// a bad duration, a wrong type, two validation problems) reports them all in one load, each
// with its line, and its column where the problem is one token.
func TestLoadReportsEveryProblem(t *testing.T) {
	want := []string{
		`testdata/mistakes.yaml:3:16: drain_timeout: invalid duration "soon" (use e.g. "1s", "250ms")`,
		`testdata/mistakes.yaml:6:3: timeouts.idel: unknown key (did you mean "idle"?)`,
		`testdata/mistakes.yaml:11:17: clusters[0].endpoints[0].weight: expected an integer, got "heavy"`,
		`testdata/mistakes.yaml:14:9: clusters[1].endpoints[0].urll: unknown key (did you mean "url"?)`,
		`testdata/mistakes.yaml:19: routes[0].retry.attempts: 11 is out of range [1, 10] (attempts per candidate, the first included)`,
		`testdata/mistakes.yaml:21: routes[1].cluster: unknown cluster "embeddings"`,
	}
	data, err := os.ReadFile("testdata/mistakes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		load   func() (*Config, error)
		prefix string // what stands for "testdata/mistakes.yaml:" in the wanted lines
	}{
		{"LoadFile", func() (*Config, error) { return LoadFile("testdata/mistakes.yaml") }, "testdata/mistakes.yaml:"},
		{"LoadFileForReplicas", func() (*Config, error) { return LoadFileForReplicas("testdata/mistakes.yaml") }, "testdata/mistakes.yaml:"},
		{"Parse", func() (*Config, error) { return Parse(data) }, "line "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.load()
			if c != nil || err == nil {
				t.Fatalf("a bad file loaded: %v", err)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v (%T), want a *ValidationError", err, err)
			}
			if len(ve.Problems) != len(want) {
				t.Errorf("%d problems, want %d:\n%v", len(ve.Problems), len(want), err)
			}
			msg := err.Error()
			for _, w := range want {
				w = tc.prefix + strings.TrimPrefix(w, "testdata/mistakes.yaml:")
				if !strings.Contains(msg, "\n  "+w+"\n") && !strings.HasSuffix(msg, "\n  "+w) {
					t.Errorf("error lacks the line\n  %s\nin:\n%v", w, err)
				}
			}
		})
	}
}

// TestValidFilesLoadUnchanged: a file the strict decoder takes loads exactly as it did
// before problems were placed (the same Config, deep), anchors and merge keys included.
func TestValidFilesLoadUnchanged(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	files = append(files, "testdata/anchors.yaml")
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			got, err := LoadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			want := strictLoad(t, file)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("LoadFile differs from a strict decode:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// strictLoad is LoadFile as it was: yaml.v3's strict decoder, then Finish.
func strictLoad(t *testing.T, file string) *Config {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	c, err := strictParse(data, func(c *Config) { c.resolvePaths(filepath.Dir(file)) })
	if err != nil {
		t.Fatal(err)
	}
	c.Source = file
	return c
}

func strictParse(data []byte, prepare func(*Config)) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	sum := sha256.Sum256(data)
	c.Version = hex.EncodeToString(sum[:6])
	if prepare != nil {
		prepare(&c)
	}
	if err := c.Finish(); err != nil {
		return nil, err
	}
	return &c, nil
}
