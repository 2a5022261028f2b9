package fairqueue

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Tenant IDs. The queue keeps meters of its own in the quota store under
// names that begin with a NUL byte; a valid tenant ID holds no control
// character, so no caller can name itself into one of them.

// MaxTenantIDLen bounds a tenant ID, in bytes.
const MaxTenantIDLen = 256

// TenantIDError says why a string is not a valid tenant ID.
type TenantIDError struct {
	// Offset is the byte at which the ID goes wrong (for a long ID, the
	// bound).
	Offset int
	// Rune is the character refused; utf8.RuneError for a byte that is
	// not UTF-8; 0 for an ID that is too long.
	Rune rune
	// TooLong is set for an ID over MaxTenantIDLen bytes.
	TooLong bool
}

func (e *TenantIDError) Error() string {
	switch {
	case e.TooLong:
		return fmt.Sprintf("longer than %d bytes", MaxTenantIDLen)
	case e.Rune == utf8.RuneError:
		return fmt.Sprintf("not UTF-8 at byte %d", e.Offset)
	case unicode.IsControl(e.Rune):
		return fmt.Sprintf("a control character (%U) at byte %d", e.Rune, e.Offset)
	}
	return fmt.Sprintf("an invisible or unassigned character (%U) at byte %d", e.Rune, e.Offset)
}

// CheckTenantID returns nil when id may name a tenant, else a
// *TenantIDError. A tenant ID is at most MaxTenantIDLen bytes of UTF-8
// text whose every character is printable (unicode.IsPrint): control
// characters reach internal names and forge log lines, and invisible ones
// make two different IDs look the same. The empty ID names no tenant.
func CheckTenantID(id string) error {
	if len(id) > MaxTenantIDLen {
		return &TenantIDError{Offset: MaxTenantIDLen, TooLong: true}
	}
	for i := 0; i < len(id); {
		if c := id[i]; c >= 0x20 && c < 0x7f {
			i++ // printable ASCII, nearly every ID
			continue
		}
		r, size := utf8.DecodeRuneInString(id[i:])
		if r == utf8.RuneError && size <= 1 || r != utf8.RuneError && !unicode.IsPrint(r) {
			return &TenantIDError{Offset: i, Rune: r}
		}
		i += size
	}
	return nil
}
