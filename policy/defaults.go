package policy

import (
	"errors"
	"fmt"
)

// Default sets *v to d when *v is the zero value: how params fill in their defaults.
func Default[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Check collects every problem a params Validate finds, so all are reported at once.
type Check struct{ errs []error }

// Add records one problem.
func (c *Check) Add(format string, a ...any) { c.errs = append(c.errs, fmt.Errorf(format, a...)) }

// NonNegative records a problem when v < 0.
func (c *Check) NonNegative(name string, v int) {
	if v < 0 {
		c.Add("%s must not be negative, got %d", name, v)
	}
}

// NonNegativeDuration records a problem when d < 0.
func (c *Check) NonNegativeDuration(name string, d Duration) {
	if d < 0 {
		c.Add("%s must not be negative, got %s", name, d.D())
	}
}

// Err is every problem joined, or nil.
func (c *Check) Err() error { return errors.Join(c.errs...) }
