package llmapi

// maxNesting is encoding/json's limit on nesting, which validJSON shares
// so that it agrees with json.Valid on every input.
const maxNesting = 10000

// validJSON reports what json.Valid reports, at a fraction of its cost:
// encoding/json's scanner makes an indirect call per byte, this makes a
// table lookup per string byte. It accepts RFC 8259 JSON with any bytes
// >= 0x20 in strings (json.Valid checks no UTF-8 either) and at most
// maxNesting levels of arrays and objects.
func validJSON(b []byte) bool {
	var stackBuf [MaxDepth]bool // open containers, true for an object
	stack := stackBuf[:0]
	i := skipJSONSpace(b, 0)
	needValue := true
	for {
		if needValue {
			if i >= len(b) {
				return false
			}
			switch c := b[i]; {
			case c == '{' || c == '[':
				if len(stack) >= maxNesting {
					return false
				}
				stack = append(stack, c == '{')
				i = skipJSONSpace(b, i+1)
				if i < len(b) && (c == '{' && b[i] == '}' || c == '[' && b[i] == ']') {
					stack = stack[:len(stack)-1]
					i++
					needValue = false
					continue
				}
				if c == '{' {
					if i = validKey(b, i); i < 0 {
						return false
					}
				}
				continue
			case c == '"':
				i = validString(b, i)
			case c == '-' || c >= '0' && c <= '9':
				i = validNumber(b, i)
			case c == 't':
				i = validLiteral(b, i, "true")
			case c == 'f':
				i = validLiteral(b, i, "false")
			case c == 'n':
				i = validLiteral(b, i, "null")
			default:
				return false
			}
			if i < 0 {
				return false
			}
			needValue = false
		}
		// After a value.
		i = skipJSONSpace(b, i)
		if len(stack) == 0 {
			return i == len(b)
		}
		if i >= len(b) {
			return false
		}
		object := stack[len(stack)-1]
		switch b[i] {
		case ',':
			i = skipJSONSpace(b, i+1)
			if object {
				if i = validKey(b, i); i < 0 {
					return false
				}
			}
			needValue = true
		case '}', ']':
			if (b[i] == '}') != object {
				return false
			}
			stack = stack[:len(stack)-1]
			i++
		default:
			return false
		}
	}
}

// skipJSONSpace returns the index of the first byte at or after b[i]
// that is not white space. Every byte of JSON text above the space is not,
// which answers for most with one compare.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// validKey checks a member name and its colon at b[i], and returns where
// the member's value starts (after white space), or -1.
func validKey(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = validString(b, i); i < 0 {
		return -1
	}
	i = skipJSONSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipJSONSpace(b, i+1)
}

// stringByte marks the bytes a string cannot hold as they are: control
// characters, the quote and the backslash.
var stringByte = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// validString returns the index past the string at b[i] == '"', or -1.
func validString(b []byte, i int) int {
	for j := i + 1; j < len(b); {
		j = stringSpecial(b, j)
		if j >= len(b) {
			break
		}
		switch b[j] {
		case '"':
			return j + 1
		case '\\':
			if j+1 >= len(b) {
				return -1
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) {
					return -1
				}
				for _, h := range b[j+2 : j+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1
					}
				}
				j += 6
			default:
				return -1
			}
		default:
			return -1 // a control character
		}
	}
	return -1
}

// validNumber returns the index past the number at b[i], or -1.
func validNumber(b []byte, i int) int {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func validLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}
