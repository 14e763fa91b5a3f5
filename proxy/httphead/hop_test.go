package httphead

import (
	"net/http"
	"reflect"
	"slices"
	"testing"
)

func TestCopyEndToEnd(t *testing.T) {
	tests := []struct {
		name string
		src  http.Header
		dst  http.Header // before the copy
		want http.Header
	}{
		{
			name: "end-to-end headers are copied",
			src:  http.Header{"Content-Type": {"application/json"}, "X-Custom": {"a", "b"}},
			want: http.Header{"Content-Type": {"application/json"}, "X-Custom": {"a", "b"}},
		},
		{
			name: "hop-by-hop headers are dropped",
			src: http.Header{
				"Connection": {"keep-alive"}, "Proxy-Connection": {"keep-alive"}, "Keep-Alive": {"timeout=5"},
				"Proxy-Authenticate": {"Basic"}, "Proxy-Authorization": {"Basic Zm9v"}, "Te": {"trailers"},
				"Trailer": {"X-T"}, "Transfer-Encoding": {"chunked"}, "Upgrade": {"websocket"},
				"Authorization": {"Bearer k"},
			},
			want: http.Header{"Authorization": {"Bearer k"}},
		},
		{
			name: "headers named in Connection are dropped, any case, several values",
			src: http.Header{
				"Connection": {"X-Foo, x-bar", " ,x-BAZ "},
				"X-Foo":      {"1"}, "X-Bar": {"2"}, "X-Baz": {"3"}, "X-Keep": {"4"},
			},
			want: http.Header{"X-Keep": {"4"}},
		},
		{
			name: "existing values are replaced, others kept",
			src:  http.Header{"X-A": {"new"}},
			dst:  http.Header{"X-A": {"old"}, "X-Request-Id": {"id"}},
			want: http.Header{"X-A": {"new"}, "X-Request-Id": {"id"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := tt.dst
			if dst == nil {
				dst = http.Header{}
			}
			srcCopy := tt.src.Clone()
			CopyEndToEnd(dst, tt.src)
			if !reflect.DeepEqual(dst, tt.want) {
				t.Errorf("got %v, want %v", dst, tt.want)
			}
			if !reflect.DeepEqual(tt.src, srcCopy) {
				t.Errorf("source modified: %v, was %v", tt.src, srcCopy)
			}
		})
	}
}

// TestCopyEndToEndNoAliasing: the destination must not share a backing array with the
// source, or appending to one header set would write into the other.
func TestCopyEndToEndNoAliasing(t *testing.T) {
	src := http.Header{"X-A": make([]string, 1, 4)}
	src["X-A"][0] = "a"
	dst := http.Header{}
	CopyEndToEnd(dst, src)
	dst.Add("X-A", "b")
	src.Add("X-A", "c")
	if got := dst.Values("X-A"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("dst X-A = %v, want [a b]", got)
	}
}

// TestCopyEndToEndShareNothing: the copied values share one backing array, but adding to one
// header (or to the source) never changes another, and hop-by-hop headers stay behind.
func TestCopyEndToEndShareNothing(t *testing.T) {
	src := http.Header{"A": {"1"}, "B": {"2", "3"}, "C": {"4"}, "Connection": {"keep-alive, X-Hop"}, "X-Hop": {"h"}}
	dst := http.Header{}
	CopyEndToEnd(dst, src)
	for k := range dst {
		dst.Add(k, "added")
	}
	src.Add("A", "src")
	want := http.Header{"A": {"1", "added"}, "B": {"2", "3", "added"}, "C": {"4", "added"}}
	if !reflect.DeepEqual(dst, want) {
		t.Errorf("copy after adds: %v, want %v", dst, want)
	}
	if !reflect.DeepEqual(src["B"], []string{"2", "3"}) || !reflect.DeepEqual(src["A"], []string{"1", "src"}) {
		t.Errorf("source changed: %v", src)
	}
}

func TestHopByHop(t *testing.T) {
	got := HopByHop("keep-alive, x-hop", " ,X-Other ")
	for _, want := range []string{"Connection", "Keep-Alive", "X-Hop", "X-Other", "Transfer-Encoding", "Proxy-Authorization"} {
		if !slices.Contains(got, want) {
			t.Errorf("HopByHop: %v lacks %s", got, want)
		}
	}
	if slices.Contains(got, "Content-Length") {
		t.Errorf("HopByHop: %v names Content-Length, an end-to-end header", got)
	}
}

// TestIsHopByHop: the switch the copy checks names against is the list HopByHop gives, and
// nothing else (a near name, a lower-case one).
func TestIsHopByHop(t *testing.T) {
	for _, k := range hopByHop {
		if !isHopByHop(k) {
			t.Errorf("isHopByHop(%q) = false for a name of hopByHop", k)
		}
	}
	for _, k := range []string{"", "Content-Length", "Connections", "Tee", "connection", "Keep-Alive2", "X-Upgrade"} {
		if isHopByHop(k) {
			t.Errorf("isHopByHop(%q) = true", k)
		}
	}
}

// TestCopyEndToEndSharesFullLists: value lists with no room to grow (as Header reads them)
// are shared, not copied (no allocation into a map that has room), and an Add to either
// header still leaves the other as it was; a list with room is copied.
func TestCopyEndToEndSharesFullLists(t *testing.T) {
	src, _, ok := Header("Content-Type: a\r\nX-A: 1\r\nX-B: 2\r\nX-A: 3\r\n\r\n", nil)
	if !ok {
		t.Fatal("Header refused the head")
	}
	roomy := make([]string, 1, 4)
	roomy[0] = "r"
	src["X-Roomy"] = roomy
	dst := make(http.Header, 8)
	CopyEndToEnd(dst, src)
	if &dst["Content-Type"][0] != &src["Content-Type"][0] {
		t.Error("a full list was copied")
	}
	if &dst["X-Roomy"][0] == &src["X-Roomy"][0] {
		t.Error("a list with room to grow is shared")
	}
	for k := range dst {
		dst.Add(k, "dst")
	}
	for k := range src {
		src.Add(k, "src")
	}
	for k, vv := range dst {
		if vv[len(vv)-1] != "dst" || slices.Contains(vv, "src") {
			t.Errorf("dst %s = %q", k, vv)
		}
	}
	for k, vv := range src {
		if vv[len(vv)-1] != "src" || slices.Contains(vv, "dst") {
			t.Errorf("src %s = %q", k, vv)
		}
	}
	full := http.Header{"A": {"1"}, "B": {"2"}, "C": {"3"}}
	into := make(http.Header, 8)
	if a := testing.AllocsPerRun(100, func() { CopyEndToEnd(into, full) }); a != 0 {
		t.Errorf("copying full lists: %v allocations", a)
	}
}
