package batchmanager

import (
	"bytes"
	"encoding/json"
	"time"

	"go.uber.org/zap"
)

// Stats is one iteration's statistics. Its JSON form (MarshalJSON) uses the seed's
// field names: the common and paged-KV fields always, then the in-flight fields
// (Generation Requests, MicroBatch ID) or the V1 fields (Total Generation Tokens,
// Empty Generation Slots), then gollm's own (Paused Requests, Waiting Requests,
// Reused KV cache blocks).
type Stats struct {
	// Time is when the iteration started.
	Time time.Time
	// IterationCounter counts the iterations that ran the engine.
	IterationCounter uint64
	// ActiveRequestCount is the number of admitted, unfinished requests (running,
	// paused, or finished and held for the end of a V1 batch).
	ActiveRequestCount int
	// MaxRequestCount is the most requests the manager holds at once (max batch size).
	MaxRequestCount int
	// MaxKVCacheBlocks is the size of the KV pool.
	MaxKVCacheBlocks int
	// FreeKVCacheBlocks is the number of blocks free (reusable cached blocks included).
	FreeKVCacheBlocks int
	// UsedKVCacheBlocks is the number of blocks held by requests.
	UsedKVCacheBlocks int
	// TokensPerKVCacheBlock is the number of positions per block.
	TokensPerKVCacheBlock int
	// ScheduledRequests is the number of requests in the iteration's batch.
	ScheduledRequests int
	// ContextRequests is the number of those in the context phase (including paused
	// requests recomputing theirs).
	ContextRequests int
	// GenerationRequests is the number of those in the generation phase.
	GenerationRequests int
	// TotalContextTokens is the number of context tokens in the batch.
	TotalContextTokens int
	// TotalGenerationTokens is the number of tokens sampled in the iteration.
	TotalGenerationTokens int
	// EmptyGenerationSlots is the number of V1 slots whose sequence already finished.
	EmptyGenerationSlots int
	// MicroBatchID is the micro batch of the iteration (gollm runs one: always 0).
	MicroBatchID int
	// PausedRequests is the number of requests paused (max_utilization) right now.
	PausedRequests int
	// WaitingRequests is the number of accepted requests not admitted yet.
	WaitingRequests int
	// ReusedKVCacheBlocks is the total number of blocks reused by prefix since start.
	ReusedKVCacheBlocks uint64
	// DraftTokens is the number of tokens proposed in the iteration (speculative
	// decoding), AcceptedDraftTokens those accepted, and SpeculativeSequences the
	// sequences that verified proposals.
	DraftTokens, AcceptedDraftTokens, SpeculativeSequences int
	// DraftTokensTotal, AcceptedDraftTokensTotal and SpeculativeStepsTotal are the same
	// counts since start: acceptance rate AcceptedDraftTokensTotal / DraftTokensTotal,
	// mean accepted length (tokens a speculative step gives a sequence)
	// (AcceptedDraftTokensTotal + SpeculativeStepsTotal) / SpeculativeStepsTotal.
	DraftTokensTotal, AcceptedDraftTokensTotal, SpeculativeStepsTotal uint64
	// SpeculationHeldOff says the adaptive policy (Speculation.Adaptive) held proposals
	// off in the iteration, where requests could have speculated, because they did not
	// pay at its batch size; SpeculationHeldOffTotal counts such iterations since start.
	SpeculationHeldOff      bool
	SpeculationHeldOffTotal uint64
	// EngineTime is the wall time of the iteration's Engine.Step; the rest of the
	// iteration is the manager's and its callbacks'. Not in the JSON (the seed has no
	// such field); IterationStats callbacks and traces read it.
	EngineTime time.Duration
	// V1 says the stats come from a V1 manager (selects the JSON fields).
	V1 bool
}

// timestampLayout is the seed's "%m-%d-%Y %H:%M:%S".
const timestampLayout = "01-02-2006 15:04:05"

// statsCommon are the JSON fields every iteration reports.
type statsCommon struct {
	Timestamp             string `json:"Timestamp"`
	IterationCounter      uint64 `json:"Iteration Counter"`
	ActiveRequestCount    int    `json:"Active Request Count"`
	MaxRequestCount       int    `json:"Max Request Count"`
	MaxKVCacheBlocks      int    `json:"Max KV cache blocks"`
	FreeKVCacheBlocks     int    `json:"Free KV cache blocks"`
	UsedKVCacheBlocks     int    `json:"Used KV cache blocks"`
	TokensPerKVCacheBlock int    `json:"Tokens per KV cache block"`
	ScheduledRequests     int    `json:"Scheduled Requests"`
	ContextRequests       int    `json:"Context Requests"`
	TotalContextTokens    int    `json:"Total Context Tokens"`
}

// statsGollm are gollm's own JSON fields.
type statsGollm struct {
	PausedRequests      int    `json:"Paused Requests"`
	WaitingRequests     int    `json:"Waiting Requests"`
	ReusedKVCacheBlocks uint64 `json:"Reused KV cache blocks"`
	DraftTokens         int    `json:"Draft Tokens,omitempty"`
	AcceptedDraftTokens int    `json:"Accepted Draft Tokens,omitempty"`
}

// statsInflight is the JSON of an in-flight batching iteration.
type statsInflight struct {
	statsCommon
	GenerationRequests int `json:"Generation Requests"`
	MicroBatchID       int `json:"MicroBatch ID"`
	statsGollm
}

// statsV1 is the JSON of a V1 iteration.
type statsV1 struct {
	statsCommon
	TotalGenerationTokens int `json:"Total Generation Tokens"`
	EmptyGenerationSlots  int `json:"Empty Generation Slots"`
	statsGollm
}

// MarshalJSON encodes the stats under the seed's names.
func (s Stats) MarshalJSON() ([]byte, error) {
	stamp := s.Time.Format(timestampLayout)
	if s.V1 {
		return json.Marshal(s.v1JSON(stamp))
	}
	return json.Marshal(s.inflightJSON(stamp))
}

// common are the fields every iteration reports, with the timestamp formatted.
func (s *Stats) common(stamp string) statsCommon {
	return statsCommon{
		Timestamp:             stamp,
		IterationCounter:      s.IterationCounter,
		ActiveRequestCount:    s.ActiveRequestCount,
		MaxRequestCount:       s.MaxRequestCount,
		MaxKVCacheBlocks:      s.MaxKVCacheBlocks,
		FreeKVCacheBlocks:     s.FreeKVCacheBlocks,
		UsedKVCacheBlocks:     s.UsedKVCacheBlocks,
		TokensPerKVCacheBlock: s.TokensPerKVCacheBlock,
		ScheduledRequests:     s.ScheduledRequests,
		ContextRequests:       s.ContextRequests,
		TotalContextTokens:    s.TotalContextTokens,
	}
}

// gollm are gollm's own fields.
func (s *Stats) gollm() statsGollm {
	return statsGollm{PausedRequests: s.PausedRequests, WaitingRequests: s.WaitingRequests, ReusedKVCacheBlocks: s.ReusedKVCacheBlocks,
		DraftTokens: s.DraftTokens, AcceptedDraftTokens: s.AcceptedDraftTokens}
}

// inflightJSON is the JSON form of an in-flight batching iteration.
func (s *Stats) inflightJSON(stamp string) statsInflight {
	return statsInflight{statsCommon: s.common(stamp), GenerationRequests: s.GenerationRequests, MicroBatchID: s.MicroBatchID, statsGollm: s.gollm()}
}

// v1JSON is the JSON form of a V1 iteration.
func (s *Stats) v1JSON(stamp string) statsV1 {
	return statsV1{statsCommon: s.common(stamp), TotalGenerationTokens: s.TotalGenerationTokens, EmptyGenerationSlots: s.EmptyGenerationSlots, statsGollm: s.gollm()}
}

// statsEncoder writes the stats JSON of every iteration (the bytes of MarshalJSON)
// into one reused buffer, formatting the timestamp, which counts seconds, once a
// second.
type statsEncoder struct {
	// buf receives the JSON.
	buf bytes.Buffer
	// enc encodes into buf; nil until first used.
	enc *json.Encoder
	// inflight and v1 are the values encoded, reused so that no copy is boxed.
	inflight statsInflight
	// v1 is encoded for V1 models, in place of inflight.
	v1 statsV1
	// sec is the Unix second that stamp formats.
	sec int64
	// loc is the location that stamp is formatted in.
	loc *time.Location
	// stamp is the formatted timestamp of sec; "" before the first.
	stamp string
}

// encode returns the stats JSON of s; the bytes are valid until the next call.
func (e *statsEncoder) encode(s *Stats) ([]byte, error) {
	if e.enc == nil {
		e.enc = json.NewEncoder(&e.buf)
	}
	if sec, loc := s.Time.Unix(), s.Time.Location(); sec != e.sec || loc != e.loc || e.stamp == "" {
		e.sec, e.loc, e.stamp = sec, loc, s.Time.Format(timestampLayout)
	}
	e.buf.Reset()
	var err error
	if s.V1 {
		e.v1 = s.v1JSON(e.stamp)
		err = e.enc.Encode(&e.v1)
	} else {
		e.inflight = s.inflightJSON(e.stamp)
		err = e.enc.Encode(&e.inflight)
	}
	if err != nil {
		return nil, err
	}
	// Encode ends the value with a newline; MarshalJSON does not.
	return bytes.TrimSuffix(e.buf.Bytes(), []byte("\n")), nil
}

// snapshot gathers the stats of the current state and iteration.
func (m *Manager) snapshot(now time.Time) Stats {
	ps := m.pool.Stats()
	return Stats{
		Time:                     now,
		IterationCounter:         m.iter,
		ActiveRequestCount:       len(m.running) + len(m.paused) + len(m.held),
		MaxRequestCount:          m.cfg.MaxBatchSize,
		MaxKVCacheBlocks:         ps.Max,
		FreeKVCacheBlocks:        ps.Free,
		UsedKVCacheBlocks:        ps.Used,
		TokensPerKVCacheBlock:    m.pool.TokensPerBlock(),
		ScheduledRequests:        len(m.sched),
		ContextRequests:          m.it.ctxReqs,
		GenerationRequests:       m.it.genReqs,
		TotalContextTokens:       m.it.ctxTokens,
		TotalGenerationTokens:    m.it.genTokens,
		EmptyGenerationSlots:     m.it.emptySlots,
		PausedRequests:           len(m.paused),
		WaitingRequests:          len(m.waiting),
		ReusedKVCacheBlocks:      ps.Reused,
		DraftTokens:              m.it.drafted,
		AcceptedDraftTokens:      m.it.accepted,
		SpeculativeSequences:     m.it.specSteps,
		DraftTokensTotal:         m.specTotal.drafted,
		AcceptedDraftTokensTotal: m.specTotal.accepted,
		SpeculativeStepsTotal:    m.specTotal.steps,
		SpeculationHeldOff:       m.policy != nil && m.policy.heldNow,
		SpeculationHeldOffTotal:  m.policyHeldOff(),
		EngineTime:               m.it.engine,
		V1:                       m.cfg.ModelType == V1,
	}
}

// policyHeldOff is the adaptive policy's count of iterations held off.
func (m *Manager) policyHeldOff() uint64 {
	if m.policy == nil {
		return 0
	}
	return m.policy.heldOff
}

// publishStats records the stats and, for an iteration that ran the engine, hands
// them to the stats callbacks.
func (m *Manager) publishStats(now time.Time, worked bool) {
	s := m.snapshot(now)
	m.statsMu.Lock()
	m.last = s
	m.statsMu.Unlock()
	if !worked {
		return
	}
	if m.cb.ReturnBatchManagerStats != nil {
		b, err := m.statsEnc.encode(&s)
		if err != nil {
			m.log.Error("encoding stats", zap.Error(err))
		} else {
			m.callStats(func() { m.cb.ReturnBatchManagerStats(string(b)) })
		}
	}
	if m.cb.IterationStats != nil {
		m.callStats(func() { m.cb.IterationStats(s) })
	}
}

// callStats runs a stats callback, containing a panic in it.
func (m *Manager) callStats(f func()) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("stats callback panicked", zap.Any("panic", r))
		}
	}()
	f()
}
