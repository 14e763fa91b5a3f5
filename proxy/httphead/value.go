package httphead

// ValidValue reports whether v is a valid header field value, as
// httpguts.ValidHeaderFieldValue does (no control byte but horizontal tab, no DEL), eight
// bytes at a time: every value of a request is checked where it is read and again where it
// is written, and real clients send many (the official SDKs a dozen or more).
func ValidValue(v string) bool {
	const (
		ones = 0x0101010101010101
		high = 0x8080808080808080
	)
	i := 0
	for ; i+8 <= len(v); i += 8 {
		w := uint64(v[i]) | uint64(v[i+1])<<8 | uint64(v[i+2])<<16 | uint64(v[i+3])<<24 |
			uint64(v[i+4])<<32 | uint64(v[i+5])<<40 | uint64(v[i+6])<<48 | uint64(v[i+7])<<56
		del := w ^ (0x7f * ones)
		// A byte under 0x20, or a DEL: look at the eight one by one (a tab is allowed).
		if (w-0x20*ones)&^w&high != 0 || (del-ones)&^del&high != 0 {
			for _, c := range []byte(v[i : i+8]) {
				if !validValueByte(c) {
					return false
				}
			}
		}
	}
	for ; i < len(v); i++ {
		if !validValueByte(v[i]) {
			return false
		}
	}
	return true
}

func validValueByte(c byte) bool { return (c >= 0x20 || c == '\t') && c != 0x7f }
