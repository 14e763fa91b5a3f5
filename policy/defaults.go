package policy

// Default sets *v to d when *v is the zero value: how params fill in their defaults.
func Default[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
