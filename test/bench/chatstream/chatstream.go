// Package chatstream is the benchmark tools' client of a streaming chat request: it sends one
// and reads it to its end, timing the first event that carries content.
package chatstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// TTFT sends body as a streaming chat request to base (/v1/chat/completions), reads the
// answer to its end and returns the time from sending to the first data event with
// non-empty content. A status other than 200, a stream without such an event, or one that
// does not end with data: [DONE], is an error.
func TTFT(ctx context.Context, client *http.Client, base string, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return read(resp.Body, start)
}

// read reads an SSE chat stream to its data: [DONE] and returns the time from start to its
// first event with content.
func read(r io.Reader, start time.Time) (time.Duration, error) {
	var ttft time.Duration
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case ttft == 0 && bytes.HasPrefix(line, []byte("data: {")) &&
			bytes.Contains(line, []byte(`"content":"`)) && !bytes.Contains(line, []byte(`"content":""`)):
			ttft = max(time.Since(start), 1) // not 0, which says none yet
		case bytes.Equal(line, []byte("data: [DONE]")):
			if ttft == 0 {
				return 0, errors.New("no content event before data: [DONE]")
			}
			return ttft, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("the stream ended without data: [DONE]")
}
