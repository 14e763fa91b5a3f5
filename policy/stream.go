package policy

// StreamEvent is one server-sent event of a streamed answer on its way to the client. Its
// slices point into the relay's buffer: they are valid only during the call that gets them.
type StreamEvent struct {
	Raw  []byte // the event as it is written: its field lines and the blank line ending it
	Name []byte // its "event:" name, nil when it has none (chat and completions streams)
	Data []byte // its data, nil for a comment or keep-alive; "[DONE]" ends a chat stream
}

// IsDone reports whether the event is a chat or completions stream's end marker.
func (e StreamEvent) IsDone() bool { return string(e.Data) == "[DONE]" }

// StreamAction is what a stream watcher says of one event. The zero value relays the event
// as it is.
type StreamAction struct {
	// Replace, when non-nil, is written in place of the event's Raw (a filter that strips a
	// field the client did not ask for). It must be whole events; an empty, non-nil slice
	// drops the event.
	Replace []byte
	// Cut, when non-nil, ends the stream at this event: the event itself is not relayed,
	// the upstream request is cancelled (the model server frees the sequence), and the
	// client gets Cut.Tail and the end of the stream.
	Cut *StreamCut
}

// StreamCut ends a stream on a filter's word.
type StreamCut struct {
	// Class names why (its row in the class table; counted in the Outcome's ErrorClass).
	Class Class
	// Tail is written to the client in place of the rest of the stream: whole events (a
	// final chunk with its finish_reason, an SSE comment saying why, the end marker).
	Tail []byte
	// Reason is a short sentence for the log.
	Reason string
}

// StreamFilter is a plugin that watches streamed answers on their way to the client
// (output-side protection, signals computed from the tokens).
type StreamFilter interface {
	// WatchStream starts watching one attempt's stream for r, once its first event
	// arrived; nil when the filter has nothing to do with this one. It must not block.
	WatchStream(r *Request) StreamWatcher
}

// StreamWatcher watches one stream. Its methods are called from one goroutine, in event
// order, and must not block: it runs on the relay's path, once per event.
type StreamWatcher interface {
	// Event sees one event before it is written.
	Event(ev StreamEvent) StreamAction
	// End is called once when the stream ends, whatever the reason (also after a Cut).
	// flags, when the watcher raised any, name what it saw (e.g. ClassRunaway for a loop
	// that was only counted): they reach the Observers in Outcome.Flags.
	End() (flags []Class)
}

// BodyFilter is a plugin that reads whole (non-streamed) successful answers before they are
// written to the client: the output side of answers that are not streamed.
type BodyFilter interface {
	// WatchBody sees the answer's body (valid only during the call). replace, when non-nil,
	// is what the client gets instead (the first filter's replacement wins; every filter
	// sees the body as the model server sent it); flags reach the Observers in
	// Outcome.Flags. It must not block.
	WatchBody(r *Request, body []byte) (replace []byte, flags []Class)
}
