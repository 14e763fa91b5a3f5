package policy

// Glob reports whether name matches pattern: '*' matches any run of bytes ('/' included), '?'
// any one byte, and ASCII letters match regardless of case; an empty pattern matches only the
// empty name. It backtracks only to the last star, so it runs in O(len(pattern) × len(name))
// at worst, never recurses and does not allocate: patterns from a config or an admin request
// cannot make it expensive. Model globs (the guard's context windows) and chaos filters
// (route, model, cluster) use it.
func Glob(pattern, name string) bool {
	p, n := 0, 0
	starP, starN := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			starP, starN = p, n
			p++
		case p < len(pattern) && (pattern[p] == '?' || lowerASCII(pattern[p]) == lowerASCII(name[n])):
			p++
			n++
		case starP >= 0:
			starN++
			p, n = starP+1, starN
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
