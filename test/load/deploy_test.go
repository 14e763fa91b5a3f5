package load

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestDeployJob checks that deploy/load-job.yaml parses and that its Job runs indexed shards
// whose count agrees with the --shard argument.
func TestDeployJob(t *testing.T) {
	b, err := os.ReadFile("../../deploy/load-job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var job map[string]any
	kinds := 0
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		kinds++
		if doc["kind"] == "Job" {
			job = doc
		}
	}
	if job == nil || kinds != 2 {
		t.Fatalf("want a Job and a PVC, got %d documents, job %v", kinds, job != nil)
	}
	spec := job["spec"].(map[string]any)
	if spec["completionMode"] != "Indexed" || spec["completions"] != spec["parallelism"] {
		t.Errorf("spec %v", spec)
	}
	c := spec["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	args := c["args"].([]any)
	want := fmt.Sprintf("--shard=$(JOB_COMPLETION_INDEX)/%d", spec["completions"])
	found := false
	for _, a := range args {
		if a == want {
			found = true
		}
	}
	if args[0] != "load" || !found {
		t.Errorf("args %v lack %q", args, want)
	}
}
