package llmapi

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestParseRandomRequests: random request-shaped bodies, and each of them
// mutated (the near misses where a decoder or a key match errs), pass
// FuzzParse's checks.
func TestParseRandomRequests(t *testing.T) {
	c := mustCounter(t, Approx)
	rng := rand.New(rand.NewPCG(7, 8))
	special := []byte("{}[],:\"\\/ \t\n0123456789-.etrufalsnu\x00\x1f\xff")
	for n := 0; n < 3000; n++ {
		var sb strings.Builder
		randomRequest(rng, &sb)
		doc := []byte(sb.String())
		path := fuzzPaths[rng.IntN(len(fuzzPaths))]
		checkParse(t, c, path, doc)
		for m := 0; m < 8; m++ {
			checkParse(t, c, path, mutate(rng, doc, special))
		}
	}
}

// mutate returns b with one or two bytes replaced, inserted or removed.
func mutate(rng *rand.Rand, doc, special []byte) []byte {
	b := append([]byte(nil), doc...)
	for k := 1 + rng.IntN(2); k > 0; k-- {
		p := rng.IntN(len(b) + 1)
		c := special[rng.IntN(len(special))]
		switch rng.IntN(3) {
		case 0:
			if p < len(b) {
				b[p] = c
			}
		case 1:
			b = append(b[:p], append([]byte{c}, b[p:]...)...)
		case 2:
			if p < len(b) {
				b = append(b[:p], b[p+1:]...)
			}
		}
	}
	return b
}

// randomRequest writes a random body of the shapes the APIs use, with
// the oddities a client may send: members in any order, nulls, values of
// the wrong type, duplicates, escaped keys, nested tool results, white
// space.
func randomRequest(rng *rand.Rand, sb *strings.Builder) {
	ws := func() {
		if rng.IntN(6) == 0 {
			sb.WriteString([]string{" ", "\n", "\t ", "\r\n"}[rng.IntN(4)])
		}
	}
	key := func(k string) {
		ws()
		switch rng.IntN(100) {
		case 0:
			k = strings.Replace(k, "e", `\u0065`, 1)
		case 1:
			k += "x"
		}
		sb.WriteString(`"` + k + `"`)
		ws()
		sb.WriteByte(':')
		ws()
	}
	str := func() {
		sb.WriteString([]string{`"hi"`, `""`, `"a \"q\" \\ \n é"`, `"text"`, `"tool_result"`, `"\u00e9\ud83d\ude00"`, `"x"`}[rng.IntN(7)])
	}
	var value func(d int)
	value = func(d int) {
		ws()
		switch k := rng.IntN(10); {
		case k == 0:
			sb.WriteString("null")
		case k == 1:
			sb.WriteString([]string{"1", "0", "-2.5e3", "true", "false", "128", "1e400"}[rng.IntN(7)])
		case k == 2 && d > 0:
			sb.WriteByte('[')
			for n := rng.IntN(3); n > 0; n-- {
				value(d - 1)
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte(']')
		case k == 3 && d > 0:
			sb.WriteByte('{')
			for n := rng.IntN(3); n > 0; n-- {
				key([]string{"a", "type", "text", "name"}[rng.IntN(4)])
				value(d - 1)
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte('}')
		default:
			str()
		}
		ws()
	}
	// members writes an object of members chosen from names, each written
	// by its function, some twice, some left out.
	type member struct {
		name  string
		write func()
	}
	object := func(ms []member) {
		sb.WriteByte('{')
		rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		first := true
		for _, m := range ms {
			n := 1
			switch rng.IntN(25) {
			case 0:
				n = 2
			case 1, 2, 3, 4, 5, 6:
				n = 0
			}
			for ; n > 0; n-- {
				if !first {
					sb.WriteByte(',')
				}
				first = false
				key(m.name)
				m.write()
			}
		}
		ws()
		sb.WriteByte('}')
	}
	var content func(d int)
	part := func(d int) {
		typ := []string{`"text"`, `"image_url"`, `"tool_result"`, `"tool_use"`, `"thinking"`, `"refusal"`, `"input_text"`, `"document"`, `null`, `3`, `"tool\u005fresult"`}[rng.IntN(11)]
		object([]member{
			{"type", func() { sb.WriteString(typ) }},
			{"text", func() { value(1) }},
			{"content", func() {
				if rng.IntN(3) == 0 {
					value(1)
				} else {
					content(d - 1)
				}
			}},
			{"name", str}, {"input", func() { value(2) }}, {"thinking", str}, {"refusal", str},
			{"cache_control", func() { value(2) }},
		})
	}
	content = func(d int) {
		switch k := rng.IntN(6); {
		case k == 0:
			sb.WriteString("null")
		case k == 1:
			value(1)
		case k <= 3 || d <= 0:
			str()
		default:
			sb.WriteByte('[')
			for n := rng.IntN(4); n > 0; n-- {
				ws()
				if rng.IntN(12) == 0 {
					value(1)
				} else {
					part(d)
				}
				ws()
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte(']')
		}
	}
	function := func() {
		if rng.IntN(6) == 0 {
			value(1)
			return
		}
		object([]member{{"name", func() { value(0) }}, {"arguments", func() { value(2) }}})
	}
	message := func() {
		if rng.IntN(20) == 0 {
			value(1)
			return
		}
		object([]member{
			{"role", func() {
				if rng.IntN(10) == 0 {
					value(1)
				} else {
					str()
				}
			}},
			{"content", func() { content(3) }},
			{"name", func() { value(0) }},
			{"tool_calls", func() {
				if rng.IntN(5) == 0 {
					value(1)
					return
				}
				sb.WriteByte('[')
				for n := rng.IntN(3); n > 0; n-- {
					if rng.IntN(4) == 0 {
						value(1)
					} else {
						object([]member{{"id", str}, {"function", function}, {"type", str}})
					}
					if n > 1 {
						sb.WriteByte(',')
					}
				}
				sb.WriteByte(']')
			}},
			{"function_call", function},
			{"tool_call_id", str},
		})
	}
	object([]member{
		{"model", func() { value(0) }},
		{"messages", func() {
			if rng.IntN(10) == 0 {
				value(1)
				return
			}
			sb.WriteByte('[')
			for n := rng.IntN(4); n > 0; n-- {
				ws()
				message()
				ws()
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte(']')
		}},
		{"system", func() { content(2) }},
		{"max_tokens", func() { value(0) }},
		{"stream", func() { value(0) }},
		{"stream_options", func() { value(1) }},
		{"tools", func() { value(2) }},
		{"input", func() { content(2) }},
		{"prompt", func() { value(2) }},
		{"n", func() { value(0) }},
		{"temperature", func() { value(0) }},
		{"metadata", func() { value(3) }},
	})
}
