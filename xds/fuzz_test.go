package xds

import (
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzParseBootstrap: a bootstrap file is operator input; no content may panic the parser,
// and a parsed one validates or says why.
func FuzzParseBootstrap(f *testing.F) {
	f.Add([]byte("node_id: a\nserver: 127.0.0.1:18000\n"))
	f.Add([]byte("server: cp:1\nsotw: true\ntls: {ca_file: ca.pem}\nload_signals: {names: tgi}\n"))
	f.Add([]byte("{\"server\": 1}"))
	f.Add([]byte("listen_tls: [1]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		bs, err := ParseBootstrap(b)
		if err != nil {
			return
		}
		_ = bs.Validate()
	})
}

// FuzzDecodeStruct: a sluice.policy TypedStruct comes from a control plane; no value may
// panic the strict decoder.
func FuzzDecodeStruct(f *testing.F) {
	f.Add(`{"policies":[{"type":"guard","params":{"max_depth":8}}],"fallback":[{"cluster":"b"}]}`)
	f.Add(`{"timeouts":{"ttft":"2s"},"mirror":{"replica_fraction":0.1}}`)
	f.Add(`{"unknown":1}`)
	f.Fuzz(func(t *testing.T, js string) {
		var s structpb.Struct
		if err := s.UnmarshalJSON([]byte(js)); err != nil {
			return
		}
		var rp RoutePolicy
		_ = DecodeStruct(&s, &rp)
		var g GlobalPolicy
		_ = DecodeStruct(&s, &g)
	})
}
