package proxy

import (
	"testing"

	"github.com/sluicegw/sluice/policy"
)

func TestStatusClass(t *testing.T) {
	for _, tt := range []struct {
		status    int
		class     policy.Class
		retryable bool
	}{
		{200, "", false}, {204, "", false}, {399, "", false},
		{400, policy.ClassUpstream4xx, false}, {404, policy.ClassUpstream4xx, false}, {413, policy.ClassUpstream4xx, false},
		{429, policy.ClassUpstream429, true},
		{500, policy.ClassUpstream5xx, true}, {503, policy.ClassUpstream5xx, true}, {599, policy.ClassUpstream5xx, true},
	} {
		if c, r := statusClass(tt.status); c != tt.class || r != tt.retryable {
			t.Errorf("statusClass(%d) = %q, %v; want %q, %v", tt.status, c, r, tt.class, tt.retryable)
		}
	}
}
