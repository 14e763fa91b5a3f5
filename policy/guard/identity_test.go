package guard

import (
	"testing"

	"github.com/sluicegw/sluice/policy"
)

func TestBreakerIdentity(t *testing.T) {
	tests := []struct {
		tenant, client, want string
	}{
		{"team-a", "10.0.0.1", "team-a"},    // a known tenant is isolated as a whole
		{"", "10.0.0.1", "client:10.0.0.1"}, // anonymous senders are isolated by address
		{"", "10.0.0.2", "client:10.0.0.2"}, // so another anonymous client is unaffected
		{"", "", ""},                        // nothing known: one shared anonymous breaker
	}
	for _, tt := range tests {
		if got := breakerIdentity(&policy.Request{Tenant: tt.tenant, Client: tt.client}); got != tt.want {
			t.Errorf("breakerIdentity(%q, %q) = %q, want %q", tt.tenant, tt.client, got, tt.want)
		}
	}
}
