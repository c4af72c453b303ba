// Command profdemo runs CPU-bound work under runtime/pprof with pprof.Do labels and writes
// cpu.pb.gz and heap.pb.gz to the directory given as its argument. Kiln's e2e tests post
// those files to /ingest. Standard library only: builds offline with Debian's golang-go.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"
)

var sink []byte

//go:noinline
func fib(n int) int {
	if n < 2 {
		return n
	}
	return fib(n-1) + fib(n-2)
}

//go:noinline
func kilnBusyCompute() int {
	return fib(27)
}

//go:noinline
func kilnBusyAllocate() {
	for i := 0; i < 200; i++ {
		sink = make([]byte, 64<<10)
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: profdemo OUTDIR")
		os.Exit(2)
	}
	out := os.Args[1]
	runtime.MemProfileRate = 4096
	cpu, err := os.Create(filepath.Join(out, "cpu.pb.gz"))
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		panic(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		pprof.Do(ctx, pprof.Labels("span_id", fmt.Sprintf("%016x", 0xabc0+i%4), "controller", "compute"), func(context.Context) {
			kilnBusyCompute()
		})
		pprof.Do(ctx, pprof.Labels("controller", "allocate"), func(context.Context) {
			kilnBusyAllocate()
		})
	}
	pprof.StopCPUProfile()
	cpu.Close()
	runtime.GC()
	heap, err := os.Create(filepath.Join(out, "heap.pb.gz"))
	if err != nil {
		panic(err)
	}
	if err := pprof.Lookup("heap").WriteTo(heap, 0); err != nil {
		panic(err)
	}
	heap.Close()
}
