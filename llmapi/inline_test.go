package llmapi

import (
	"slices"
	"testing"
)

// FuzzInlineTexts: the texts a Request keeps from its parse are the
// texts the estimate's walk gathers, and Estimate agrees either way.
func FuzzInlineTexts(f *testing.F) {
	for _, s := range fuzzSeeds() {
		for i := range fuzzPaths {
			f.Add(uint8(i), []byte(s))
		}
	}
	c := mustCounter(f, Approx)
	f.Fuzz(func(t *testing.T, pathIdx uint8, body []byte) {
		path := fuzzPaths[int(pathIdx)%len(fuzzPaths)]
		req, err := Parse(path, body)
		if err != nil {
			return
		}
		texts, _ := walkTexts(req)
		walked := textStrings(texts)
		if len(walked) != req.nTexts {
			t.Fatalf("nTexts %d, walk gathers %d", req.nTexts, len(walked))
		}
		if req.nTexts <= inlineTexts {
			inline := textStrings(req.texts[:req.nTexts])
			if !slices.Equal(inline, walked) {
				t.Fatalf("inline %q, walk %q", inline, walked)
			}
		}
		fast := Estimate(req, c, 16)
		slow := *req
		slow.walked = false
		if got := Estimate(&slow, c, 16); got != fast {
			t.Fatalf("Estimate %+v with the parse's texts, %+v by a walk", fast, got)
		}
	})
}
