package proxy

import "testing"

func TestStatusClass(t *testing.T) {
	for _, tt := range []struct {
		status    int
		class     string
		retryable bool
	}{
		{200, "", false}, {204, "", false}, {399, "", false},
		{400, classUpstream4xx, false}, {404, classUpstream4xx, false}, {413, classUpstream4xx, false},
		{429, classUpstream429, true},
		{500, classUpstream5xx, true}, {503, classUpstream5xx, true}, {599, classUpstream5xx, true},
	} {
		if c, r := statusClass(tt.status); c != tt.class || r != tt.retryable {
			t.Errorf("statusClass(%d) = %q, %v; want %q, %v", tt.status, c, r, tt.class, tt.retryable)
		}
	}
}
