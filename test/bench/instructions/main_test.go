package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTotals: the instruction count is read from a callgrind dump's totals line (or, in older
// formats, its summary line); a dump without either is an error, never a zero count.
func TestTotals(t *testing.T) {
	for _, tc := range []struct {
		name, dump string
		want       float64
		ok         bool
	}{
		{"totals", "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=(1) main\n5 10\ntotals: 438150211\n", 438150211, true},
		{"summary", "events: Ir\nsummary: 1234 5\n", 1234, true},
		{"none", "events: Ir\nfn=(1) main\n5 10\n", 0, false},
		{"not a number", "totals: many\n", 0, false},
		{"empty", "totals: \n", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cg.out.1")
			if err := os.WriteFile(path, []byte(tc.dump), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := totals(path)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("totals = %v, %v; want %v (ok %v)", got, err, tc.want, tc.ok)
			}
		})
	}
}
