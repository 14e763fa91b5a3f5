package load

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// runSessions runs generated multi-turn sessions: session starts are paced by Rate (or
// Concurrency sessions run at once); each turn carries the whole history and plants a marker.
func (e *engine) runSessions(ctx context.Context, start time.Time) {
	sp := e.cfg.Workload.Sessions
	run := func(j int, scheduled time.Time) { e.session(ctx, j, scheduled) }
	if e.cfg.Concurrency > 0 && e.cfg.Rate == 0 {
		jobs := make(chan int)
		var wg sync.WaitGroup
		for range e.cfg.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range jobs {
					run(j, time.Now())
				}
			}()
		}
	feed:
		for j := range sp.Sessions {
			if !e.mine(j) {
				continue
			}
			if e.cfg.Duration > 0 && time.Since(start) > e.cfg.Duration {
				break
			}
			select {
			case jobs <- j:
			case <-ctx.Done():
				break feed
			}
		}
		close(jobs)
		wg.Wait()
		return
	}
	p := NewRatePacer(e.cfg.Rate, e.cfg.Arrival, e.cfg.Burstiness, e.cfg.Seed)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for j := range sp.Sessions {
		at, ok := p.Next()
		if !ok || (e.cfg.Duration > 0 && at > e.cfg.Duration) {
			return
		}
		if !e.mine(j) {
			continue
		}
		due := start.Add(at)
		if !e.waitUntil(ctx, timer, due) {
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			run(j, due)
		}()
	}
}

// Marker returns the context-fidelity marker planted in turn t of session j.
func Marker(seed uint64, j, t int) string { return fmt.Sprintf("[[mem:s%x-%d-%d]]", seed&0xffff, j, t) }

func (e *engine) session(ctx context.Context, j int, scheduled time.Time) {
	sp := e.cfg.Workload.Sessions
	rng := rand.New(rand.NewPCG(e.cfg.Seed^0x5e55, uint64(j)))
	id := fmt.Sprintf("load-%x-%d", e.cfg.Seed&0xffffff, j)
	var history []Message
	var planted []string
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for t := range sp.Turns {
		if ctx.Err() != nil {
			return
		}
		// The turn is built before its send time, so that building it (tokenizing the
		// history) is not counted as scheduling lag.
		in, out := sp.In.Draw(rng), sp.Out.Draw(rng)
		m := Marker(e.cfg.Seed, j, t)
		text := e.synth.Marked(in, m, e.cfg.Seed*7919+uint64(j*sp.Turns+t))
		msgs := append(append([]Message(nil), history...), Message{Role: "user", Content: text})
		input := in
		for _, h := range history {
			input += CountTokens(h.Content)
		}
		c := &call{index: j*sp.Turns + t, messages: msgs, input: input, maxTokens: out, session: id, turn: t,
			markers: append([]string(nil), planted...), keepText: true}
		if e.cfg.Endpoint == "completions" {
			c.messages = nil
			for _, h := range msgs {
				c.prompt += h.Content + "\n"
			}
		}
		c.body = e.encode(c)
		if t > 0 && !e.waitUntil(ctx, timer, scheduled) {
			return
		}
		e.sent.Add(1)
		e.inflight.Add(1)
		res := e.do(ctx, c, scheduled)
		e.inflight.Add(-1)
		e.col.Add(res)
		if !res.OK() {
			return // the conversation cannot go on without its answer
		}
		history = append(msgs, Message{Role: "assistant", Content: res.Text})
		planted = append(planted, m)
		scheduled = time.Now().Add(GammaDuration(rng, sp.ThinkShape, sp.ThinkScale))
	}
}
