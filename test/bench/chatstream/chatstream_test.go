package chatstream

import (
	"strings"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	token := `data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n"
	for _, tc := range []struct {
		name, stream string
		ok           bool
	}{
		{"whole", role + token + "data: [DONE]\n\n", true},
		{"no content", role + "data: [DONE]\n\n", false},
		{"cut off", role + token, false},
		{"an error event only", `data: {"error":{"message":"overloaded"}}` + "\n\ndata: [DONE]\n\n", false},
	} {
		ttft, err := read(strings.NewReader(tc.stream), time.Now())
		if (err == nil) != tc.ok || (tc.ok && ttft <= 0) {
			t.Errorf("%s: ttft %v, err %v; want ok %v", tc.name, ttft, err, tc.ok)
		}
	}
}
