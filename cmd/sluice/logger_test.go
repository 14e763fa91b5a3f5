package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	for _, tt := range []struct {
		level, format string
		check         func(out string) bool
		err           string
	}{
		{"info", "text", func(out string) bool { return strings.Contains(out, "level=INFO msg=hello k=v") }, ""},
		{"info", "json", func(out string) bool {
			var m map[string]any
			return json.Unmarshal([]byte(out), &m) == nil && m["msg"] == "hello" && m["k"] == "v" && m["level"] == "INFO"
		}, ""},
		{"warn", "json", func(out string) bool { return out == "" }, ""}, // info is below warn
		{"info", "yaml", nil, `--log-format: "yaml" is not text or json`},
		{"loud", "text", nil, "--log-level"},
	} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, tt.level, tt.format)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s/%s: err = %v, want %q", tt.level, tt.format, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s/%s: %v", tt.level, tt.format, err)
		}
		log.Info("hello", "k", "v")
		if !tt.check(strings.TrimSpace(buf.String())) {
			t.Errorf("%s/%s: logged %q", tt.level, tt.format, buf.String())
		}
	}
}
