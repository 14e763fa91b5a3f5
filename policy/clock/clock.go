// Package clock is the time source shared by policies and load signals: an interface with
// Now, so that breakers, limiters, batchers and the GPU scraper are tested on a fake clock
// (policy/clocktest) without sleeping. It imports nothing of Sluice's: packages below policy
// (gpu) take it without depending on the policy contracts.
package clock

import "time"

// Clock is a time source.
type Clock interface {
	Now() time.Time
}

// System is the real clock.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }
