package e2e

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluicegw/sluice/test/sim"
)

// TestEmbeddingsBatching: concurrent embeddings requests through a route that batches are
// merged into fewer upstream requests, and every caller gets exactly its own vectors (equal to
// what the model server gives for that input alone) with its own usage.
func TestEmbeddingsBatching(t *testing.T) {
	s := startSim(t, sim.Config{EmbedRequestCost: 20 * time.Millisecond, EmbedItemCost: time.Millisecond})
	g := startGateway(t, fmt.Sprintf(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: a, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: embed
    cluster: a
    policies:
      - {type: batch, params: {min_window: 5ms, max_window: 20ms, max_in_flight: 1}}
`, s.URL))
	client := newClient(t, g.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Reference vectors: each input alone, straight to the simulator.
	direct := newClient(t, s.URL[len("http://"):])
	const callers = 16
	inputs := make([][]string, callers)
	want := make([][][]float64, callers)
	for i := range callers {
		inputs[i] = []string{fmt.Sprintf("caller %d first", i)}
		if i%3 == 0 {
			inputs[i] = append(inputs[i], fmt.Sprintf("caller %d second", i))
		}
		for _, in := range inputs[i] {
			r, err := direct.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "sim-llama",
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{in}}})
			if err != nil {
				t.Fatal(err)
			}
			want[i] = append(want[i], r.Data[0].Embedding)
		}
	}
	before := s.Stats().Requests

	var wg sync.WaitGroup
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "sim-llama",
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs[i]}})
			if err != nil {
				errs[i] = err
				return
			}
			if len(r.Data) != len(inputs[i]) {
				errs[i] = fmt.Errorf("caller %d got %d vectors for %d inputs", i, len(r.Data), len(inputs[i]))
				return
			}
			for j, d := range r.Data {
				if d.Index != int64(j) {
					errs[i] = fmt.Errorf("caller %d item %d has index %d", i, j, d.Index)
					return
				}
				for k := range d.Embedding {
					if math.Abs(d.Embedding[k]-want[i][j][k]) > 1e-6 {
						errs[i] = fmt.Errorf("caller %d item %d differs from the input's own vector", i, j)
						return
					}
				}
			}
			if r.Usage.PromptTokens <= 0 {
				errs[i] = fmt.Errorf("caller %d usage %+v", i, r.Usage)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	upstream := s.Stats().Requests - before
	if upstream >= callers {
		t.Errorf("the model server saw %d requests for %d callers: nothing was merged", upstream, callers)
	}
	t.Logf("%d callers → %d upstream requests", callers, upstream)
}
