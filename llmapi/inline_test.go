package llmapi

import (
	"reflect"
	"slices"
	"testing"
)

// textRefSize, which bounds the texts a Request keeps, is a textRef's
// size.
func TestTextRefSize(t *testing.T) {
	if got := reflect.TypeOf(textRef{}).Size(); got != textRefSize {
		t.Errorf("a textRef is %d bytes, textRefSize says %d", got, textRefSize)
	}
}

// FuzzInlineTexts: the texts a Request keeps from its parse are the
// texts the estimate's walk gathers, it keeps them whenever there are
// few enough (keptTexts), and Estimate agrees either way.
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
		walked := textStrings(nil, texts)
		if len(walked) != req.nTexts {
			t.Fatalf("nTexts %d, walk gathers %d", req.nTexts, len(walked))
		}
		if req.allTexts() {
			kept := textStrings(nil, append(req.texts[:min(req.nTexts, inlineTexts)], req.more...))
			if !slices.Equal(kept, walked) {
				t.Fatalf("kept %q, walk %q", kept, walked)
			}
		} else if req.walked && req.nTexts <= keptTexts(len(body)) {
			t.Fatalf("%d texts of a %d-byte body not kept", req.nTexts, len(body))
		}
		fast := Estimate(req, c, 16)
		slow := *req
		slow.walked = false
		if got := Estimate(&slow, c, 16); got != fast {
			t.Fatalf("Estimate %+v with the parse's texts, %+v by a walk", fast, got)
		}
	})
}
