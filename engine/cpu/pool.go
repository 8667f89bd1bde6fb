package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// parallelFor splits [0, n) into contiguous chunks whose sizes are multiples of align
// and at least minChunk — a few per GOMAXPROCS, so that a core slowed by other work, or
// given the slower rows, takes fewer — and runs fn on each: the calling goroutine and
// the pool's helpers take chunks until none is left. worker is the goroutine's index
// among those running the call, below GOMAXPROCS, so that each may use scratch of its
// own.
//
// A decode step runs a hundred or more of these, each a fraction of a millisecond. The
// helpers are long-lived goroutines that, after a job, poll for the next one for a
// short while (helperSpin) before they park: handing a chunk to a parked goroutine costs
// waking an OS thread, tens of microseconds that would leave the other core idle at
// every matmul. The caller waits for the chunks it did not run the same way.
func parallelFor(n, align, minChunk int, fn func(worker, lo, hi int)) {
	if n <= 0 {
		return
	}
	procs := runtime.GOMAXPROCS(0)
	chunks := procs * chunksPerProc
	if minChunk < 1 {
		minChunk = 1
	}
	if most := n / minChunk; most < chunks {
		chunks = most
	}
	if chunks <= 1 {
		fn(0, 0, n)
		return
	}
	size := (n + chunks - 1) / chunks
	if align > 1 {
		size = (size + align - 1) / align * align
	}
	chunks = (n + size - 1) / size
	j := &forJob{fn: fn, n: n, size: size, chunks: int32(chunks), slots: int32(min(procs, chunks)), done: make(chan struct{})}
	j.left.Store(int32(chunks))
	workers.post(j, int(j.slots)-1)
	j.run()
	if j.left.Load() == 0 {
		return
	}
	deadline := time.Now().Add(helperSpin)
	for i := 0; j.left.Load() != 0; i++ {
		if i%64 == 63 && time.Now().After(deadline) {
			<-j.done
			return
		}
		runtime.Gosched()
	}
}

// chunksPerProc is how many chunks parallelFor makes per GOMAXPROCS, at most.
const chunksPerProc = 4

// helperSpin is how long an idle helper, and a caller waiting for helpers, polls before
// it blocks.
const helperSpin = 500 * time.Microsecond

// forJob is one parallelFor call's chunks.
type forJob struct {
	fn      func(worker, lo, hi int)
	n, size int
	chunks  int32
	slots   int32        // the most goroutines that run it
	joined  atomic.Int32 // the goroutines that have
	next    atomic.Int32 // the next chunk to take
	left    atomic.Int32 // chunks not yet finished
	done    chan struct{}
}

// run takes and runs chunks until none is left, as the job's next worker.
func (j *forJob) run() {
	w := j.joined.Add(1) - 1
	if w >= j.slots {
		return
	}
	for {
		c := j.next.Add(1) - 1
		if c >= j.chunks {
			return
		}
		lo := int(c) * j.size
		j.fn(int(w), lo, min(lo+j.size, j.n))
		if j.left.Add(-1) == 0 {
			close(j.done)
		}
	}
}

// pool is the helper goroutines parallelFor hands chunks to.
type pool struct {
	mu      sync.Mutex
	helpers int
	jobs    chan *forJob
	idle    atomic.Int32 // helpers polling or parked, an estimate
}

var workers = &pool{jobs: make(chan *forJob, 256)}

// post offers job j to up to k helpers, starting helpers up to GOMAXPROCS-1. A full
// queue drops the offer: the caller runs what no helper takes.
func (p *pool) post(j *forJob, k int) {
	if want := runtime.GOMAXPROCS(0) - 1; int(p.idle.Load()) < k {
		p.mu.Lock()
		for p.helpers < want {
			p.helpers++
			go p.helper()
		}
		p.mu.Unlock()
	}
	for range k {
		select {
		case p.jobs <- j:
		default:
			return
		}
	}
}

// helper runs the jobs posted, polling for helperSpin after each before it parks.
func (p *pool) helper() {
	for {
		p.idle.Add(1)
		var j *forJob
		deadline := time.Now().Add(helperSpin)
		for i := 0; j == nil; i++ {
			select {
			case j = <-p.jobs:
				continue
			default:
			}
			if i%64 == 63 && time.Now().After(deadline) {
				j = <-p.jobs
				break
			}
			runtime.Gosched()
		}
		p.idle.Add(-1)
		j.run()
	}
}
