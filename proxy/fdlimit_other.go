//go:build !unix

package proxy

// openFileLimit is unknown here: the connection bound is then only the configured one.
func openFileLimit() int { return 0 }
