package batchmanager

import "fmt"

// The length rule, one for every door (the backend's inputs, the executor, the
// manager's intake): a request has a prompt of at least one token and asks for at least
// one new token, and its prompt plus the tokens it asks for fit the model's maximum
// sequence length. One that does not is refused, naming the numbers; MaxNewTokens is
// never cut down to fit (a client that wants "as many as fit" asks for the difference).

// CheckLengths applies the length rule to a prompt of promptLen tokens asking for
// maxNewTokens under a model of maxSeqLen positions. Its errors start with promptName
// or outputName, whichever input the caller read the failing number from.
func CheckLengths(promptLen, maxNewTokens, maxSeqLen int, promptName, outputName string) error {
	switch {
	case promptLen < 1:
		return fmt.Errorf("%s: the prompt is empty", promptName)
	case maxNewTokens < 1:
		return fmt.Errorf("%s: must be at least 1, got %d", outputName, maxNewTokens)
	case promptLen >= maxSeqLen:
		return fmt.Errorf("%s: a prompt of %d tokens leaves no room for a new token under the model's maximum sequence length %d", promptName, promptLen, maxSeqLen)
	case maxNewTokens > maxSeqLen-promptLen:
		return fmt.Errorf("%s: prompt length %d + %d exceeds the model's maximum sequence length %d (at most %d new tokens fit)", outputName, promptLen, maxNewTokens, maxSeqLen, maxSeqLen-promptLen)
	}
	return nil
}
