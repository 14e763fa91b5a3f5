package openai

import "testing"

func TestSetField(t *testing.T) {
	tests := []struct {
		name, body, key, value, want string
	}{
		{"replace", `{"model":"m","max_tokens":4096,"x":{"max_tokens":1}}`, "max_tokens", "512", `{"model":"m","max_tokens":512,"x":{"max_tokens":1}}`},
		{"add", `{"model":"m"}`, "max_tokens", "512", `{"max_tokens":512,"model":"m"}`},
		{"add to empty", `{}`, "max_tokens", "8", `{"max_tokens":8}`},
		{"string value", `{"model": "a" }`, "model", `"b"`, `{"model": "b" }`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SetField([]byte(tt.body), tt.key, []byte(tt.value))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
	if _, err := SetField([]byte(`[1]`), "k", []byte("1")); err == nil {
		t.Fatal("a non-object body must be an error")
	}
}
