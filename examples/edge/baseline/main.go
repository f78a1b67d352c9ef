// Command baseline is examples/edge without ratekit: it reads the same
// environment and writes an answer of the same shape, so that the size of
// the two WASI modules shows what ratekit adds.
package main

import (
	"fmt"
	"net/http"
	"os"
	"sort"
)

func main() {
	h := http.Header{}
	h.Set("Ratekit-Token", os.Getenv("RATEKIT_TOKEN"))
	h.Set("Client", os.Getenv("CLIENT_IP")+os.Getenv("RATEKIT_SECRET"))
	fmt.Printf("HTTP/1.1 %d %s\n", http.StatusOK, http.StatusText(http.StatusOK))
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("%s: %s\n", name, h.Get(name))
	}
}
