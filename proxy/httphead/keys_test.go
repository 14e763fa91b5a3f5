package httphead

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/textproto"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestKeysCanonical: Get and Set look a key up as it is given, so every constant key given to
// them anywhere in the module must be in canonical form (a lowercase key would never match a
// parsed header). It reads the module's sources for calls of httphead.Get and httphead.Set
// with a string constant as the key.
func TestKeysCanonical(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	calls := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name != ".." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Get" && sel.Sel.Name != "Set") {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "httphead" {
				return true
			}
			lit, ok := call.Args[1].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			calls++
			k, _ := strconv.Unquote(lit.Value)
			if c := textproto.CanonicalMIMEHeaderKey(k); c != k {
				t.Errorf("%s: httphead.%s with key %q, not canonical (%q)", fset.Position(lit.Pos()), sel.Sel.Name, k, c)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls < 5 {
		t.Errorf("found %d calls of httphead.Get and Set with a constant key: the walk missed the sources", calls)
	}
}

func TestGetSet(t *testing.T) {
	h := make(map[string][]string)
	Set(h, "X-A", "1")
	h["X-B"] = []string{"2", "3"}
	h["X-C"] = []string{}
	for k, want := range map[string]string{"X-A": "1", "X-B": "2", "X-C": "", "X-D": ""} {
		if got := Get(h, k); got != want {
			t.Errorf("Get %s = %q, want %q", k, got, want)
		}
	}
}
