package upstream

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseModels(t *testing.T) {
	long := strings.Repeat("x", maxModelID+1)
	for _, tc := range []struct {
		name string
		body string
		want []Model // Raw not compared
		err  bool
	}{
		{"vLLM", `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B","object":"model","owned_by":"vllm","max_model_len":32768}]}`,
			[]Model{{ID: "meta-llama/Llama-3.1-8B", MaxModelLen: 32768}}, false},
		{"Ollama (no max_model_len)", `{"object":"list","data":[{"id":"llama3:8b","object":"model","created":1,"owned_by":"library"},{"id":"qwen2"}]}`,
			[]Model{{ID: "llama3:8b"}, {ID: "qwen2"}}, false},
		{"bad entries skipped", `{"data":[{"id":""},{"id":5},"x",{"id":"` + long + `"},{"id":"ok","max_model_len":-3},{"id":"big","max_model_len":1e30}]}`,
			[]Model{{ID: "ok"}, {ID: "big"}}, false},
		{"empty list", `{"object":"list","data":[]}`, []Model{}, false},
		{"not a list", `{"models":[]}`, nil, true},
		{"not json", `<html>`, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseModels([]byte(tc.body))
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d models %+v, want %+v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i].ID != tc.want[i].ID || got[i].MaxModelLen != tc.want[i].MaxModelLen || len(got[i].Raw) == 0 {
					t.Errorf("model %d = %+v, want %+v with its raw object", i, got[i], tc.want[i])
				}
			}
		})
	}
	// Bounded whatever the server sends.
	var b strings.Builder
	b.WriteString(`{"data":[`)
	for i := range 3 * maxModels {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"m%d","pad":%q}`, i, strings.Repeat("p", 100))
	}
	b.WriteString(`]}`)
	got, err := ParseModels([]byte(b.String()))
	if err != nil || len(got) != maxModels {
		t.Fatalf("%d models (err %v), want the bound %d", len(got), err, maxModels)
	}
}

func FuzzParseModels(f *testing.F) {
	for _, s := range []string{`{"object":"list","data":[{"id":"a","max_model_len":4096}]}`, `{"data":[1,"x",null,{}]}`, `{}`, `[]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := ParseModels(b)
		if err != nil {
			return
		}
		if len(ms) > maxModels {
			t.Fatalf("%d models", len(ms))
		}
		for _, m := range ms {
			if m.ID == "" || len(m.ID) > maxModelID || len(m.Raw) > maxModelObject+maxModelID+64 || m.MaxModelLen < 0 {
				t.Fatalf("model out of bounds: %+v", m)
			}
		}
	})
}

// TestModelDiscovery: the health loop asks healthy endpoints for their models (with the
// cluster's credential) and the cluster answers the union and the smallest advertised
// context window; RefreshModels asks at once; a server without /v1/models is not asked on
// every check.
func TestModelDiscovery(t *testing.T) {
	serve := func(body string, asked *atomic.Int64) *httptest.Server {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/models" {
				return // health
			}
			asked.Add(1)
			if r.Header.Get("Authorization") != "Bearer k" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			if body == "" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprint(w, body)
		}))
		t.Cleanup(ts.Close)
		return ts
	}
	var n1, n2, n3 atomic.Int64
	a := serve(`{"data":[{"id":"llama","max_model_len":32768},{"id":"embed"}]}`, &n1)
	b := serve(`{"data":[{"id":"llama","max_model_len":8192},{"id":"qwen","max_model_len":4096}]}`, &n2)
	none := serve("", &n3)
	c := newTestCluster(t, Options{
		Endpoints:      []EndpointSpec{{URL: a.URL}, {URL: b.URL}, {URL: none.URL}},
		HealthCheck:    HealthCheck{Interval: 2 * time.Millisecond},
		Authorization:  "Bearer k",
		DiscoverModels: true,
	})
	if c.Discovered() || len(c.Models()) != 0 || c.MaxModelLen("llama") != 0 {
		t.Fatal("models known before any discovery")
	}
	c.Start(t.Context())
	waitFor(t, "discovery", func() bool { return n1.Load() > 0 && n2.Load() > 0 && n3.Load() > 0 && len(c.Models()) == 3 })
	var ids []string
	for _, m := range c.Models() {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "llama,embed,qwen" {
		t.Errorf("models %v, want the union llama,embed,qwen", ids)
	}
	if got := c.MaxModelLen("llama"); got != 8192 {
		t.Errorf("MaxModelLen(llama) = %d, want the smallest advertised, 8192", got)
	}
	if c.MaxModelLen("embed") != 0 || c.MaxModelLen("nope") != 0 {
		t.Error("a context window for a model that advertises none")
	}
	time.Sleep(50 * time.Millisecond) // 25 health checks
	if n1.Load() > 2 || n3.Load() > 2 {
		t.Errorf("models asked %d and %d times in 50ms, want once per ModelsInterval (404 included)", n1.Load(), n3.Load())
	}
	c.Close()
	if allocs := testing.AllocsPerRun(100, func() { c.MaxModelLen("qwen") }); allocs != 0 {
		t.Errorf("MaxModelLen allocates %v times", allocs)
	}

	// Without health checks: nothing is asked until RefreshModels.
	var n4 atomic.Int64
	d := serve(`{"data":[{"id":"x"}]}`, &n4)
	c2 := newTestCluster(t, Options{Endpoints: []EndpointSpec{{URL: d.URL}}, Authorization: "Bearer k", DiscoverModels: true})
	c2.Start(t.Context())
	if err := c2.RefreshModels(t.Context()); err != nil || len(c2.Models()) != 1 || n4.Load() != 1 {
		t.Fatalf("RefreshModels: %v, models %+v, asked %d", err, c2.Models(), n4.Load())
	}
	if err := c2.RefreshModels(t.Context()); err != nil || n4.Load() != 1 {
		t.Errorf("a fresh list was asked again (%d)", n4.Load())
	}
}

// TestModelDiscoveryOnce: however many requests want an endpoint's models at once, one
// fetch is sent; a failed one is not repeated for modelsRetry.
func TestModelDiscoveryOnce(t *testing.T) {
	var asked atomic.Int64
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		<-release
		w.WriteHeader(http.StatusInternalServerError) // a server busy for a moment
	}))
	t.Cleanup(ts.Close)
	clock := newFakeClock()
	c := newTestCluster(t, Options{Endpoints: []EndpointSpec{{URL: ts.URL}}, DiscoverModels: true, Clock: clock})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { _ = c.RefreshModels(t.Context()) })
	}
	waitFor(t, "the one fetch", func() bool { return asked.Load() == 1 })
	close(release)
	wg.Wait()
	if n := asked.Load(); n != 1 {
		t.Fatalf("20 concurrent refreshes sent %d fetches, want 1", n)
	}
	for range 5 {
		_ = c.RefreshModels(t.Context())
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("a failed fetch was repeated at once (%d)", n)
	}
	// A caller that found the models due just before that fetch ended (it checked, then was
	// descheduled) does not send another.
	_ = c.refresh(t.Context(), c.endpoints[0])
	if n := asked.Load(); n != 1 {
		t.Errorf("a refresh that lost the race to a finished fetch sent another (%d)", n)
	}
	clock.Advance(modelsRetry + time.Second)
	_ = c.RefreshModels(t.Context())
	if n := asked.Load(); n != 2 {
		t.Errorf("after modelsRetry: %d fetches, want 2", n)
	}
}
