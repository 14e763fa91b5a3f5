package runaway

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

var (
	storyPrefix = "Once upon a time, in a small village by the sea, there lived an old fisherman who told stories to the children every evening. "
	storyLoop   = "He said that the sea was wide and deep, and that nobody knew where it ended. "
)

func story(copies int) string { return storyPrefix + strings.Repeat(storyLoop, copies) }

// tailEvents splits a tail into its events' data (and comments, as they are).
func tailEvents(t *testing.T, tail []byte) (datas []map[string]any, comments []string, done bool) {
	t.Helper()
	checkTail(t, tail)
	r := openai.NewReader(strings.NewReader(string(tail)), 0)
	for {
		ev, err := r.Next()
		if err != nil {
			return
		}
		switch {
		case ev.Data == nil:
			comments = append(comments, strings.TrimSpace(string(ev.Raw)))
		case ev.IsDone():
			done = true
		default:
			var v map[string]any
			if err := json.Unmarshal(ev.Data, &v); err != nil {
				t.Fatal(err)
			}
			if len(ev.Name) > 0 {
				v["(event)"] = string(ev.Name)
			}
			datas = append(datas, v)
		}
	}
}

var cutComment = regexp.MustCompile(`^: sluice: runaway generation cut after (\d+) tokens$`)

func TestCutChat(t *testing.T) {
	p := newPolicy(t, Params{})
	w := p.WatchStream(streamRequest(t, openai.KindChat, "acme", 1))
	stream := chatStream(story(200), 1)
	relayed, cut := run(t, w, stream)
	if cut == nil {
		t.Fatal("the loop was not cut")
	}
	if cut.Class != policy.ClassRunaway || !strings.Contains(cut.Reason, "repeats a block of 18 tokens") {
		t.Fatalf("cut %+v", cut)
	}
	// The loop starts after the role chunk, the prefix and one copy; it is cut within the
	// bound (18-token copies weigh 57 quarter words: 7 copies, 126 tokens, fewer events).
	loopStart := 1 + len(pieces(storyPrefix)) + len(pieces(storyLoop))
	if relayed < loopStart || relayed > loopStart+8*len(pieces(storyLoop)) {
		t.Fatalf("cut after %d events, the loop started at event %d", relayed, loopStart)
	}
	datas, comments, done := tailEvents(t, cut.Tail)
	if !done || len(datas) != 1 || len(comments) != 1 || !cutComment.MatchString(comments[0]) {
		t.Fatalf("tail %q", cut.Tail)
	}
	c := datas[0]
	ch := c["choices"].([]any)[0].(map[string]any)
	if c["id"] != streamID || c["model"] != streamModel || c["created"] != float64(streamCreated) || c["object"] != "chat.completion.chunk" ||
		ch["index"] != float64(0) || ch["finish_reason"] != "length" || len(ch["delta"].(map[string]any)) != 0 {
		t.Fatalf("final chunk %v", c)
	}
	// The detector's tokens: the comment says how many.
	if want := fmt.Sprintf("after %d tokens", w.(*watcher).tokens()); !strings.Contains(comments[0], want) {
		t.Fatalf("comment %q, want %q", comments[0], want)
	}
	// After the cut nothing is read; End gives the detectors back and flags nothing (the cut
	// is the Outcome's ErrorClass).
	if a := w.Event(policy.StreamEvent{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`)}); a.Cut != nil {
		t.Fatal("cut twice")
	}
	if flags := w.End(); flags != nil {
		t.Fatalf("flags %v after a cut", flags)
	}
	if ww := w.(*watcher); slices.ContainsFunc(ww.dets, func(d *Detector) bool { return d != nil }) {
		t.Fatal("End kept a detector")
	}
	s := p.Stats()
	if s.Streams != 1 || s.Cut != 1 || s.Flagged != 0 || len(s.Counts) != 1 || s.Counts[0] != (Count{Tenant: "acme", Model: streamModel, Cut: 1}) {
		t.Fatalf("stats %+v", s)
	}
	snap := p.Snapshot()
	if len(snap.Recent) != 1 || snap.Recent[0].RequestID != "req-1" || snap.Recent[0].Period != 18 || snap.Recent[0].Field != FieldText ||
		snap.Recent[0].Action != ActionCut || snap.Route != "r" || snap.Params.Action != ActionCut {
		t.Fatalf("snapshot %+v", snap)
	}
}

func TestCutChoices(t *testing.T) {
	for _, tc := range []struct {
		name    string
		texts   []string
		finals  []float64 // the choices the tail closes
		loopsAt int       // the choice that loops
	}{
		{"the looping choice only: the other finished", []string{"A short and ordinary answer.", story(300)}, []float64{1}, 1},
		{"both: the other is still writing", []string{story(300), storyPrefix + strings.Repeat("Another sentence that goes on. And on, with more words. ", 2) + story(300)}, []float64{0, 1}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Params{})
			w := p.WatchStream(streamRequest(t, openai.KindChat, "", len(tc.texts)))
			_, cut := run(t, w, chatStreamOf(tc.texts...))
			if cut == nil {
				t.Fatal("not cut")
			}
			datas, _, done := tailEvents(t, cut.Tail)
			var finals []float64
			for _, d := range datas {
				ch := d["choices"].([]any)[0].(map[string]any)
				if ch["finish_reason"] != "length" {
					t.Fatalf("final chunk %v", d)
				}
				finals = append(finals, ch["index"].(float64))
			}
			if !done || !slices.Equal(finals, tc.finals) {
				t.Fatalf("final chunks for %v, want %v", finals, tc.finals)
			}
			if r := p.Snapshot().Recent[0]; r.Choice != tc.loopsAt || r.Tenant != labelAnon {
				t.Fatalf("detection %+v", r)
			}
			w.End()
		})
	}
}

// TestCutEventFinish: a choice that finished in the event that is cut (not relayed) still gets
// its final chunk in the tail.
func TestCutEventFinish(t *testing.T) {
	p := newPolicy(t, Params{})
	w := p.WatchStream(streamRequest(t, openai.KindChat, "acme", 2))
	relay := func(data string) policy.StreamAction {
		return w.Event(policy.StreamEvent{Data: []byte(data)})
	}
	relay(`{"id":"c","model":"m","created":1,"choices":[{"index":0,"delta":{"content":"Fine."}},{"index":1,"delta":{"content":"` + storyPrefix + `"}}]}`)
	var cut *policy.StreamCut
	for i := 0; i < 200 && cut == nil; i++ {
		cut = relay(`{"id":"c","model":"m","created":1,"choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":1,"delta":{"content":"` + storyLoop + `"}}]}`).Cut
	}
	if cut == nil {
		t.Fatal("not cut")
	}
	datas, _, _ := tailEvents(t, cut.Tail)
	var finals []float64
	for _, d := range datas {
		finals = append(finals, d["choices"].([]any)[0].(map[string]any)["index"].(float64))
	}
	// Choice 0's finish was relayed in the events before the cut one: only choice 1 is closed.
	if !slices.Equal(finals, []float64{1}) {
		t.Fatalf("final chunks for %v", finals)
	}
	w.End()

	// The loop completes in the first event with choice 0's finish: that event is not
	// relayed, so both are closed.
	w = p.WatchStream(streamRequest(t, openai.KindChat, "acme", 2))
	relay(`{"choices":[{"index":1,"delta":{"content":"` + story(5) + `"}}]}`)
	cut = relay(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":1,"delta":{"content":"` + strings.Repeat(storyLoop, 5) + `"}}]}`).Cut
	if cut == nil {
		t.Fatal("not cut")
	}
	datas, _, _ = tailEvents(t, cut.Tail)
	if len(datas) != 2 {
		t.Fatalf("tail %q", cut.Tail)
	}
	w.End()
}

func TestCutToolArguments(t *testing.T) {
	args := `{"events": [` + strings.Repeat(`{"title": "Stand-up", "room": "4.12", "minutes": 15}, `, 200)
	for _, tc := range []struct {
		fields []string
		cut    bool
	}{{nil, true}, {[]string{FieldArguments}, true}, {[]string{FieldText}, false}} {
		p := newPolicy(t, Params{Fields: tc.fields})
		w := p.WatchStream(streamRequest(t, openai.KindChat, "acme", 1))
		_, cut := run(t, w, toolStream(args))
		if (cut != nil) != tc.cut {
			t.Fatalf("fields %v: cut %v, want %v", tc.fields, cut != nil, tc.cut)
		}
		if cut != nil {
			if r := p.Snapshot().Recent[0]; r.Field != FieldArguments || r.Period != 28 {
				t.Fatalf("fields %v: detection %+v", tc.fields, r)
			}
			if !strings.Contains(cut.Reason, "choice 0's arguments") {
				t.Fatalf("reason %q", cut.Reason)
			}
		}
		w.End()
	}
}

func TestCutCompletion(t *testing.T) {
	p := newPolicy(t, Params{})
	w := p.WatchStream(streamRequest(t, openai.KindCompletion, "acme", 1))
	_, cut := run(t, w, completionStream(story(200)))
	if cut == nil {
		t.Fatal("not cut")
	}
	datas, comments, done := tailEvents(t, cut.Tail)
	if !done || len(datas) != 1 || len(comments) != 1 {
		t.Fatalf("tail %q", cut.Tail)
	}
	c := datas[0]
	ch := c["choices"].([]any)[0].(map[string]any)
	if c["id"] != "cmpl-7b" || c["object"] != "text_completion" || c["model"] != streamModel ||
		ch["text"] != "" || ch["finish_reason"] != "length" || ch["index"] != float64(0) {
		t.Fatalf("final chunk %v", c)
	}
	w.End()
}

func TestCutResponses(t *testing.T) {
	p := newPolicy(t, Params{})
	r := streamRequest(t, openai.KindResponses, "acme", 1)
	w := p.WatchStream(r)
	relayed, cut := run(t, w, responsesStream(story(200)))
	if cut == nil {
		t.Fatal("not cut")
	}
	datas, comments, done := tailEvents(t, cut.Tail)
	if done || len(datas) != 1 || len(comments) != 1 || !strings.HasPrefix(string(cut.Tail), ": sluice: runaway generation cut after ") {
		t.Fatalf("tail %q", cut.Tail)
	}
	e := datas[0]
	resp := e["response"].(map[string]any)
	usage := resp["usage"].(map[string]any)
	tokens := float64(w.(*watcher).tokens())
	if e["(event)"] != "response.incomplete" || e["type"] != "response.incomplete" || e["sequence_number"] != float64(relayed) ||
		resp["id"] != "resp_6b1e0c7d" || resp["model"] != streamModel || resp["created_at"] != float64(streamCreated) ||
		resp["status"] != "incomplete" || resp["incomplete_details"].(map[string]any)["reason"] != "max_output_tokens" ||
		resp["object"] != "response" || len(resp["output"].([]any)) != 0 ||
		usage["input_tokens"] != float64(r.PromptTokens) || usage["output_tokens"] != tokens || usage["total_tokens"] != float64(r.PromptTokens)+tokens {
		t.Fatalf("terminal event %v", e)
	}
	// The Tap reads the tail's event as the answer's end: length.
	var tap openai.Tap
	tap.Observe(openai.Event{Name: []byte("response.incomplete"), Data: []byte(cut.Tail[strings.Index(string(cut.Tail), "data: ")+6 : len(cut.Tail)-2])}, time.Unix(0, 0))
	if !tap.Done || tap.FinishReason != "length" || tap.ErrorSeen {
		t.Fatalf("the tap reads the tail as %+v", tap)
	}
	w.End()
}

func TestFlag(t *testing.T) {
	p := newPolicy(t, Params{Action: ActionFlag})
	w := p.WatchStream(streamRequest(t, openai.KindChat, "acme", 1))
	stream := chatStream(story(200), 1)
	relayed, cut := run(t, w, stream)
	if cut != nil {
		t.Fatal("flag cut the stream")
	}
	if n := strings.Count(stream, "\n\n"); relayed != n {
		t.Fatalf("%d of %d events relayed", relayed, n)
	}
	if flags := w.End(); !slices.Equal(flags, []policy.Class{policy.ClassRunaway}) {
		t.Fatalf("flags %v", flags)
	}
	if flags := w.End(); flags != nil {
		t.Fatalf("a second End: flags %v", flags)
	}
	if s := p.Stats(); s.Flagged != 1 || s.Cut != 0 || s.Counts[0].Flagged != 1 {
		t.Fatalf("stats %+v", s)
	}
	if r := p.Snapshot().Recent[0]; r.Action != ActionFlag {
		t.Fatalf("detection %+v", r)
	}
}

// TestCorpusStreams streams every ordinary answer (an *.args.txt one as a tool call's
// arguments) through the watcher of each kind: nothing is cut or flagged.
func TestCorpusStreams(t *testing.T) {
	p := newPolicy(t, Params{Action: ActionFlag})
	for _, c := range loadCorpus(t) {
		streams := map[openai.Kind]string{openai.KindChat: chatStream(c.text, 1)}
		if c.args {
			streams = map[openai.Kind]string{openai.KindChat: toolStream(c.text)}
		} else {
			streams[openai.KindCompletion] = completionStream(c.text)
			streams[openai.KindResponses] = responsesStream(c.text)
		}
		for k, s := range streams {
			w := p.WatchStream(streamRequest(t, k, "acme", 1))
			run(t, w, s)
			if flags := w.End(); flags != nil {
				t.Errorf("%s (%v): flagged: %+v", c.name, k, p.Snapshot().Recent[0])
			}
		}
	}
	if s := p.Stats(); s.Flagged != 0 || s.Streams < 100 {
		t.Fatalf("stats %+v", s)
	}
}

func TestWatchStreamOnlyStreams(t *testing.T) {
	p := newPolicy(t, Params{})
	for _, tc := range []struct {
		kind openai.Kind
		body string
	}{
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{openai.KindEmbedding, `{"model":"m","input":"x"}`},
	} {
		r, err := openai.ParseRequest(tc.kind, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if w := p.WatchStream(&policy.Request{Request: r}); w != nil {
			t.Errorf("%s: watched", tc.body)
		}
	}
	if p.WatchStream(nil) != nil || p.WatchStream(&policy.Request{}) != nil {
		t.Error("watched a request without a body")
	}
	if s := p.Stats(); s.Streams != 0 {
		t.Fatalf("streams %d", s.Streams)
	}
}

func TestMaxChoices(t *testing.T) {
	p := newPolicy(t, Params{MaxChoices: 2})
	w := p.WatchStream(streamRequest(t, openai.KindChat, "acme", 3))
	if _, cut := run(t, w, chatStreamOf("fine", "also fine", story(300))); cut != nil {
		t.Fatal("choice 2 is not watched with max_choices 2")
	}
	if n := len(w.(*watcher).dets); n > 2*numChannels {
		t.Fatalf("%d detectors for 2 choices", n)
	}
	w.End()
}

// TestLabelsBounded: tenants are the configured ones, models at most maxModels, series at
// most maxSeries, the recent loops the last maxRecent.
func TestLabelsBounded(t *testing.T) {
	p := newPolicy(t, Params{Action: ActionFlag})
	p.SetPriorities(map[string]int{"acme": 1, "globex": 0})
	loop := chatStream(story(200), 1)
	for i := range 3 * maxModels {
		w := p.WatchStream(streamRequest(t, openai.KindChat, []string{"acme", "globex", "intruder"}[i%3], 1))
		run(t, w, strings.ReplaceAll(loop, streamModel, fmt.Sprintf("model-%d", i)))
		w.End()
	}
	s := p.Stats()
	models := map[string]bool{}
	var total uint64
	for _, c := range s.Counts {
		if c.Tenant != "acme" && c.Tenant != "globex" && c.Tenant != labelOther {
			t.Errorf("tenant label %q", c.Tenant)
		}
		models[c.Model] = true
		total += c.Flagged
	}
	if len(models) != maxModels+1 || !models[labelOther] || total != 3*maxModels || s.Flagged != total {
		t.Fatalf("%d model labels, %d loops: %+v", len(models), total, s)
	}
	if recent := p.Snapshot().Recent; len(recent) != maxRecent || recent[0].Model != labelOther || recent[0].Tenant != labelOther {
		t.Fatalf("recent %d, newest %+v", len(recent), recent[0])
	}

	// Series: past maxSeries pairs, one more counts as (other, other).
	q := newPolicy(t, Params{Action: ActionFlag})
	for i := range maxSeries + 10 {
		q.record(&watcher{tenant: fmt.Sprint("t", i), model: "m"}, Loop{Period: 1}, 100)
	}
	if s := q.Stats(); len(s.Counts) > maxSeries || s.Flagged != maxSeries+10 {
		t.Fatalf("%d series, %d loops", len(s.Counts), s.Flagged)
	}
}

func TestEventAllocs(t *testing.T) {
	p := newPolicy(t, Params{MinWords: 1 << 20, Repeats: 1000}) // the events repeat: no loop may be found
	w := p.WatchStream(streamRequest(t, openai.KindChat, "acme", 1))
	defer w.End()
	evs := []policy.StreamEvent{
		{Data: []byte(chatChunk(0, `{"content":" the"}`, "")[6:])},
		{Data: []byte(chatChunk(0, `{"content":" sea\n"}`, "")[6:])},
		{Data: []byte(chatChunk(0, `{"content":" was"}`, "")[6:])},
	}
	for _, ev := range evs { // the detector and the scratch buffer come first
		w.Event(ev)
	}
	if a := testing.AllocsPerRun(200, func() {
		for _, ev := range evs {
			if w.Event(ev).Cut != nil {
				t.Fatal("cut")
			}
		}
	}); a != 0 {
		t.Fatalf("%v allocations per event", a)
	}
}

func TestBuildFromRegistry(t *testing.T) {
	pl, err := policy.Build(policy.Spec{Type: "runaway", Name: "loops", Params: map[string]any{"action": "flag", "max_period": 64}}, policy.Env{Route: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	p, ok := pl.(*Policy)
	if !ok || p.TypedName() != (policy.TypedName{Type: "runaway", Name: "loops"}) || p.Params().MaxPeriod != 64 || p.Params().Action != ActionFlag {
		t.Fatalf("built %T %+v", pl, pl)
	}
	var _ policy.StreamFilter = p
	var _ policy.PrioritySetter = p
	if _, err := policy.Build(policy.Spec{Type: "runaway", Params: map[string]any{"window": 10}}, policy.Env{}); err == nil ||
		!strings.Contains(err.Error(), "window") {
		t.Fatalf("unknown param: %v", err)
	}
}

func TestValidate(t *testing.T) {
	err := Params{Action: "block", MinPeriod: 300, MaxPeriod: 200, Repeats: 1, MinWords: 3, Fields: []string{"text", "content", "text"}, MaxChoices: 65}.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`action must be "cut" or "flag", got "block"`, "min_period 300 is above max_period 200", "repeats must be in [2, 1000], got 1",
		"min_words must be in [8,", `fields[1] must be "text" or "arguments", got "content"`, `fields[2]: "text" is listed twice`, "max_choices must be in [1, 64], got 65"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v lacks %q", err, want)
		}
	}
	for _, p := range []Params{{}, {Action: ActionFlag, MinPeriod: 300}, {MaxPeriod: 4096, Repeats: 2, MinWords: 8, Fields: []string{"arguments"}, MaxChoices: 64}} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	if d := (Params{MinPeriod: 300}).WithDefaults(); d.MaxPeriod != 300 {
		t.Errorf("max_period below the min_period set: %d", d.MaxPeriod)
	}
}
