package llmapi

// parseWork parses body as Parse does and returns the bytes its readers
// were given: the work the linearity tests bound.
func parseWork(path string, body []byte) (*Request, int, error) {
	sc := getScratch()
	defer sc.release()
	req := new(Request)
	if err := sc.parse(req, path, body); err != nil {
		return nil, sc.rs.n, err
	}
	return req, sc.rs.n, nil
}

// walkTexts walks req's body again, as Estimate does for a prompt of many
// texts, and returns all its texts and the bytes its readers were given.
func walkTexts(req *Request) ([]textRef, int) {
	var sc scratch
	texts := req.gatherTexts(&sc, 1)
	return texts, sc.rs.n
}
