// Prints every code point whose Go simple-fold representative (encoding/json's
// foldRune) differs from itself, as "rune representative" lines: the real
// table the Python go_fold is checked against.
package main

import (
	"bufio"
	"fmt"
	"os"
	"unicode"
)

func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

func main() {
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		if f := foldRune(r); f != r {
			fmt.Fprintf(w, "%d %d\n", r, f)
		}
	}
}
