package batchmanager

import (
	"math/bits"
	"time"
)

// The adaptive speculation policy (Speculation.Adaptive). Whether proposals pay depends
// on the model, the proposer and the machine: a draft model whose step costs as much as
// the target's (a small model on a GPU, launch-bound) makes every request slower however
// many of its proposals are accepted, while prompt lookup on a text the answer copies
// from pays several times over. So the manager measures, for each batch size (generating
// sequences, in powers of two), what an iteration costs and yields with proposals and
// without, and holds speculation back where it does not pay.
//
// Cost is wall time between the completions of successive iterations that both generate
// and run no prompt: under the overlap schedule that is the interval at which steps come
// out, the host's work and the proposer's included (engines that cannot overlap
// alternate long and short intervals, which the running averages even out). Yield is
// the tokens an iteration gives each generating sequence (1 without proposals; more as
// they are accepted). A bucket's gain is yield·plainCost/specCost over running
// averages; below lowGain its proposals per sequence halve, and at none it is held off;
// held off, it probes again (probeRounds iterations with one proposal a sequence) after
// probeEvery iterations, then twice as long after each probe that does not pay, up to
// probeMax; a probe above highGain turns it back on at MaxDraft. While on, every
// refreshEvery iterations (a quarter of that until it has 2·minPlain plain samples) a
// few run without proposals to keep the plain cost current, and a bucket below MaxDraft
// tries twice as many again (not within 4·refreshEvery iterations of halving them). An iteration without proposals right after one with them
// runs without its successor launched ahead (Config.Overlap), so it is not a plain
// sample.
//
// A policy decision changes only how many tokens are proposed, never a token: greedy
// output is the same with or without it.

// specPolicy is the adaptive policy's state; nil when Speculation.Adaptive is off.
type specPolicy struct {
	// max is MaxDraft.
	max int
	// buckets by bits.Len(generating sequences), the last one for every larger batch.
	buckets [8]specBucket
	// last is when the last iteration completed; zero after one that did not run the
	// engine (the next interval would count idle time).
	last time.Time
	// lastAsked says the proposer was asked in the last iteration.
	lastAsked bool
	// heldOff counts the iterations the policy held speculation off while requests could
	// have speculated; heldNow says the last one was.
	heldOff uint64
	heldNow bool
	// The tuning (newSpecPolicy's): minPlain and minSpec samples before a decision (more
	// with proposals, whose yield comes in bursts: prompt lookup matches in runs),
	// probeRounds per probe, the iteration counts between probes and plain refreshes, the
	// gains below which a bucket backs off and above which a probe turns it on, and the
	// running averages' weight of a new sample.
	minPlain, minSpec, probeRounds     int
	probeEvery, probeMax, refreshEvery int
	lowGain, highGain, weight          float64
}

// specBucket is one batch size's measurements and decision.
type specBucket struct {
	// limit is the most proposals per sequence allowed; 0 holds speculation off.
	limit int
	// plainCost and specCost are running averages of an iteration's cost in seconds
	// without and with proposals; specYield of the tokens one with proposals gives each
	// generating sequence; plainN and specN count their samples since they were reset.
	plainCost, specCost, specYield float64
	plainN, specN                  int
	// since counts iterations since the last probe (held off) or refresh (on); wait is
	// the iterations between probes.
	since, wait int
	// refreshing says a refresh is running: plain iterations until a sample comes.
	refreshing bool
	// raiseIn counts down the iterations after a halving before a refresh may try
	// twice as many proposals again.
	raiseIn int
}

// newSpecPolicy returns the policy for MaxDraft max with its default tuning.
func newSpecPolicy(max int) *specPolicy {
	p := &specPolicy{max: max, minPlain: 3, minSpec: 8, probeRounds: 6, probeEvery: 32, probeMax: 512,
		refreshEvery: 64, lowGain: 0.98, highGain: 1.03, weight: 0.1}
	p.reset()
	return p
}

// reset forgets every measurement: buckets start on, at max.
func (p *specPolicy) reset() {
	for i := range p.buckets {
		p.buckets[i] = specBucket{limit: p.max, wait: p.probeEvery}
	}
	p.last = time.Time{}
}

// bucket is g generating sequences' bucket.
func (p *specPolicy) bucket(g int) *specBucket {
	return &p.buckets[min(bits.Len(uint(max(g, 1))), len(p.buckets)-1)]
}

// limit is the most proposals per sequence the next iteration with g generating
// sequences may carry.
func (p *specPolicy) limit(g int) int {
	if p == nil {
		return int(^uint(0) >> 1)
	}
	b := p.bucket(g)
	switch {
	case b.plainN < p.minPlain || b.refreshing:
		// The plain cost first: without it nothing can be compared.
		return 0
	case b.limit == 0:
		if b.since >= b.wait {
			// A probe, with one proposal: the cheapest that tells whether proposals
			// pay at all (a draft whose step costs as much as the model's does not
			// even at one; prompt lookup on a copying prompt does at once).
			return 1
		}
		return 0
	}
	return b.limit
}

// specSample is one completed iteration, as the policy sees it.
type specSample struct {
	// at is its completion.
	at time.Time
	// gen and ctx count its generation and prompt rows; tokens the tokens generated.
	gen, ctx, tokens int
	// asked says the proposer was asked; eligible that a request could have speculated.
	asked, eligible bool
}

// idle notes an iteration that did not run the engine: the next interval is no sample.
func (p *specPolicy) idle() {
	if p != nil {
		p.last = time.Time{}
	}
}

// observe takes a completed iteration's measurements and decides.
func (p *specPolicy) observe(s specSample) {
	if p == nil {
		return
	}
	prev, prevAsked := p.last, p.lastAsked
	p.last, p.lastAsked = s.at, s.asked
	if s.gen == 0 || s.tokens == 0 {
		// No generation, or a step that failed: nothing to measure.
		p.heldNow = false
		return
	}
	b := p.bucket(s.gen)
	p.heldNow = s.eligible && !s.asked && b.limit == 0
	if p.heldNow {
		p.heldOff++
	}
	b.since++
	b.raiseIn--
	if prev.IsZero() || s.ctx > 0 {
		return
	}
	cost := s.at.Sub(prev).Seconds()
	if !s.asked {
		if prevAsked {
			return // launched after a step with proposals: not the plain pace
		}
		b.plainCost = p.mix(b.plainCost, cost, b.plainN)
		b.plainN++
		if b.refreshing {
			b.refreshing, b.since = false, 0
			if b.limit > 0 && b.limit < p.max && b.raiseIn <= 0 {
				// Try more proposals again; the next decision halves them back if they do
				// not pay.
				b.limit, b.specN = min(p.max, 2*b.limit), 0
			}
		}
		return
	}
	b.specCost = p.mix(b.specCost, cost, b.specN)
	b.specYield = p.mix(b.specYield, float64(s.tokens)/float64(s.gen), b.specN)
	b.specN++
	gain := b.specYield * b.plainCost / b.specCost
	if b.limit == 0 {
		// A probe: its own samples decide (specN was reset when the bucket went off).
		if b.specN < p.probeRounds {
			return
		}
		b.since, b.specN = 0, 0
		if gain >= p.highGain {
			b.limit, b.wait = p.max, p.probeEvery
		} else {
			b.wait = min(2*b.wait, p.probeMax)
		}
		return
	}
	if b.since >= p.refreshEvery || b.plainN < 2*p.minPlain && b.since >= p.refreshEvery/4 {
		// Refreshed sooner while the plain cost rests on few samples: the first ones,
		// at a cold start or on a busy machine, may be far off.
		b.refreshing = true
	}
	if b.specN < p.minSpec || gain >= p.lowGain {
		return
	}
	b.limit /= 2
	b.specN, b.raiseIn = 0, 4*p.refreshEvery
	if b.limit == 0 {
		b.since, b.wait, b.refreshing = 0, p.probeEvery, false
	}
}

// mix adds x to the running average avg of n samples: their mean up to 1/weight
// samples, then an exponential average.
func (p *specPolicy) mix(avg, x float64, n int) float64 {
	w := max(p.weight, 1/float64(n+1))
	return avg + w*(x-avg)
}
