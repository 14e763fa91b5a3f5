package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

// TestReload: a bad config file is rejected with every problem listed and the old config
// keeps serving; a good one is picked up by the file watcher with no failed request while
// requests run concurrently.
func TestReload(t *testing.T) {
	alpha := startSim(t, sim.Config{Model: "alpha"})
	beta := startSim(t, sim.Config{Model: "beta"})
	cfg := func(cluster, model string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: a, endpoints: [{url: %s}]}
  - {name: b, endpoints: [{url: %s}]}
routes:
  - {name: chat, match: {model: "m*"}, cluster: %s, model: %s}
`, alpha.URL, beta.URL, cluster, model)
	}
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	g := startGateway(t, cfg("a", "alpha"), gatewayOpts{configPath: path, watchInterval: 20 * time.Millisecond})
	client := newClient(t, g.addr)
	hc := newHTTPClient(t)
	ctx := testCtx(t)
	ask := func() (string, error) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "m1",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			MaxTokens: openai.Int(4),
		})
		if err != nil {
			return "", err
		}
		return resp.Model, nil
	}
	if m, err := ask(); err != nil || m != "alpha" {
		t.Fatalf("before any reload: model %q, err %v", m, err)
	}
	version := g.srv.Config().Version

	// A bad file: every problem listed, the old config keeps serving.
	errorsBefore := metricValue(t, hc, g.admin, "sluice_config_reloads_total", `result="error"`)
	writeFileAtomic(t, path, cfg("nope", "alpha")+"  - {name: chat, cluster: a, timeouts: {ttft: -1s}}\n")
	err := g.srv.Reload()
	var ve *config.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) < 3 {
		t.Fatalf("Reload of a bad file = %v, want a ValidationError listing every problem", err)
	}
	for _, want := range []string{`unknown cluster "nope"`, "duplicate route", "ttft: must not be negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Reload error does not mention %q:\n%v", want, err)
		}
	}
	if g.srv.Config().Version != version {
		t.Fatalf("a bad config was swapped in")
	}
	for range 5 {
		if m, err := ask(); err != nil || m != "alpha" {
			t.Fatalf("after a bad reload: model %q, err %v", m, err)
		}
	}
	if got := metricValue(t, hc, g.admin, "sluice_config_reloads_total", `result="error"`); got < errorsBefore+1 {
		t.Errorf(`sluice_config_reloads_total{result="error"} = %v, want at least %v`, got, errorsBefore+1)
	}

	// A good change under load: the watcher picks it up, no request fails.
	var (
		wg              sync.WaitGroup
		stop            atomic.Bool
		ok, sawBeta     atomic.Int64
		failMu          sync.Mutex
		failures        []error
		lctx, lcancel   = context.WithTimeout(ctx, 20*time.Second)
		loadClient      = newClient(t, g.addr)
		maxPerWorker    = 2000
		concurrentLoads = 4
	)
	defer lcancel()
	for range concurrentLoads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < maxPerWorker && !stop.Load() && lctx.Err() == nil; i++ {
				stream := i%2 == 1
				var (
					model string
					err   error
				)
				params := openai.ChatCompletionNewParams{
					Model:     "m2",
					Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint("request ", i))},
					MaxTokens: openai.Int(6),
				}
				if stream {
					st := loadClient.Chat.Completions.NewStreaming(lctx, params)
					var acc openai.ChatCompletionAccumulator
					for st.Next() {
						acc.AddChunk(st.Current())
					}
					err = st.Err()
					_ = st.Close()
					model = acc.Model
				} else {
					var resp *openai.ChatCompletion
					resp, err = loadClient.Chat.Completions.New(lctx, params)
					if err == nil {
						model = resp.Model
					}
				}
				if err == nil && model != "alpha" && model != "beta" {
					err = fmt.Errorf("unexpected model %q", model)
				}
				if err != nil {
					if stop.Load() && lctx.Err() != nil {
						return
					}
					failMu.Lock()
					failures = append(failures, err)
					failMu.Unlock()
					continue
				}
				ok.Add(1)
				if model == "beta" {
					sawBeta.Add(1)
				}
			}
		}()
	}
	eventually(t, 10*time.Second, "load running", func() bool { return ok.Load() >= 20 })
	okBefore := metricValue(t, hc, g.admin, "sluice_config_reloads_total", `result="ok"`)
	writeFileAtomic(t, path, cfg("b", "beta"))
	eventually(t, 10*time.Second, "the watcher swapped the new config in", func() bool {
		return sawBeta.Load() >= 20
	})
	stop.Store(true)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed across the reload (of %d); first: %v", len(failures), int(ok.Load())+len(failures), failures[0])
	}
	if m, err := ask(); err != nil || m != "beta" {
		t.Fatalf("after the reload: model %q, err %v", m, err)
	}
	if got := metricValue(t, hc, g.admin, "sluice_config_reloads_total", `result="ok"`); got != okBefore+1 {
		t.Errorf(`sluice_config_reloads_total{result="ok"} = %v, want %v`, got, okBefore+1)
	}
	t.Logf("%d requests succeeded across the reload", ok.Load())
}

// TestReloadKeepsInFlightStreams: a reload that removes the cluster serving a stream lets the
// stream finish on the old config; the admin reload endpoint reports a bad file.
func TestReloadKeepsInFlightStreams(t *testing.T) {
	slow := startSim(t, sim.Config{ITL: 5 * time.Millisecond})
	other := startSim(t, sim.Config{})
	cfg := func(url string) string {
		return oneRoute("", "", url)
	}
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	g := startGateway(t, cfg(slow.URL), gatewayOpts{configPath: path, watchInterval: time.Hour})
	hc := newHTTPClient(t)

	_, r := openStream(t, hc, g.addr, 200)
	if first := readEvents(t, r, 3); len(first) != 3 {
		t.Fatalf("stream start: %+v", first)
	}

	// A bad file through the admin API: 400 with the problems, nothing changes.
	writeFileAtomic(t, path, cfg("ftp://nowhere"))
	resp, b := do(t, hc, "POST", "http://"+g.admin+"/admin/reload", "")
	e := checkErrorShape(t, resp, b, 400, "invalid_config")
	if !strings.Contains(e.Error.Message, "clusters[0].endpoints[0].url") {
		t.Errorf("reload error does not name the problem: %q", e.Error.Message)
	}

	writeFileAtomic(t, path, cfg(other.URL))
	resp, b = do(t, hc, "POST", "http://"+g.admin+"/admin/reload", "")
	if resp.StatusCode != 200 {
		t.Fatalf("reload: %d %s", resp.StatusCode, b)
	}
	rest := readEvents(t, r, 1000)
	if _, done, chunks := streamText(t, rest); !done || chunks != 198 {
		t.Fatalf("the in-flight stream did not survive the reload: %d more chunks, done %v", chunks, done)
	}
	resp, b = do(t, hc, "POST", "http://"+g.addr+"/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || other.Stats().Completed != 1 {
		t.Fatalf("after the reload: %d %s", resp.StatusCode, b)
	}
	if slow.Stats().Requests != 1 {
		t.Errorf("the removed endpoint got %d requests", slow.Stats().Requests)
	}
}
