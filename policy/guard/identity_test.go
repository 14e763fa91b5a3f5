package guard

import (
	"testing"

	"github.com/sluicegw/sluice/policy"
)

func TestBreakerIdentity(t *testing.T) {
	tests := []struct {
		mode, tenant, client string
		known                bool
		want                 string // "-": no breaker
	}{
		// A tenant is isolated as a whole, whatever the mode and the address.
		{AnonymousAuto, "team-a", "10.0.0.1", false, "team-a"},
		{AnonymousOff, "team-a", "10.0.0.1", true, "team-a"},
		// auto: anonymous requests by client address when it names one client, else none
		// (behind a load balancer every client has its address).
		{AnonymousAuto, "", "10.0.0.1", true, "client:10.0.0.1"},
		{AnonymousAuto, "", "10.0.0.2", true, "client:10.0.0.2"},
		{AnonymousAuto, "", "10.0.0.1", false, "-"},
		{"", "", "10.0.0.1", false, "-"}, // the zero mode is auto
		{AnonymousAuto, "", "", true, "-"},
		// client: by address always (clients known to connect directly).
		{AnonymousClient, "", "10.0.0.1", false, "client:10.0.0.1"},
		{AnonymousClient, "", "", false, "-"},
		// off: never.
		{AnonymousOff, "", "10.0.0.1", true, "-"},
	}
	for _, tt := range tests {
		g := &Guard{p: Params{Breaker: BreakerParams{Anonymous: tt.mode}}.WithDefaults()}
		got, ok := g.breakerIdentity(&policy.Request{Tenant: tt.tenant, Client: tt.client, ClientKnown: tt.known})
		if !ok {
			got = "-"
		}
		if got != tt.want {
			t.Errorf("%s: breakerIdentity(%q, %q, known %v) = %q, want %q", tt.mode, tt.tenant, tt.client, tt.known, got, tt.want)
		}
	}
}

func TestSenderOf(t *testing.T) {
	tests := []struct {
		tenant, client string
		known          bool
		want           sender
	}{
		{"team-a", "10.0.0.1", true, sender{tenant: "team-a"}},
		{"", "10.0.0.1", true, sender{client: "10.0.0.1"}},
		{"", "10.0.0.1", false, sender{}}, // the shared anonymous baseline
		{"", "", true, sender{}},
	}
	for _, tt := range tests {
		if got := senderOf(&policy.Request{Tenant: tt.tenant, Client: tt.client, ClientKnown: tt.known}); got != tt.want {
			t.Errorf("senderOf(%q, %q, known %v) = %+v, want %+v", tt.tenant, tt.client, tt.known, got, tt.want)
		}
	}
}
