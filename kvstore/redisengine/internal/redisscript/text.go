package redisscript

import (
	"strconv"
	"unsafe"
)

// Text writes the keys and arguments of one call's commands into one
// buffer and returns them as strings that refer to its bytes, so that a
// decision formats them without allocating. A string Text returned keeps
// its bytes until Reset: Text only appends, and a buffer that grows moves
// to a new array, leaving the old one to the strings that refer to it.
// After Reset the next strings overwrite the earlier ones' bytes, so a
// Text is reset only when none of its strings is in use any more: once
// the client that was given them has returned them (see redisengine.Conn).
//
// The zero Text is ready to use. A Text is not safe for concurrent use.
type Text struct {
	buf []byte
}

// Reset empties t. The strings t returned before must no longer be in use.
// buf, when t has no buffer or one larger than maxText, becomes t's
// buffer (its length is ignored), so that a pooled Text writes into an
// array of its owner's and gives back what a long call grew.
func (t *Text) Reset(buf []byte) {
	if t.buf == nil || cap(t.buf) > maxText {
		t.buf = buf
	}
	t.buf = t.buf[:0]
}

// maxText is the capacity beyond which Reset lets a grown buffer go.
const maxText = 16 << 10

// Int appends the decimal text of v to t and returns it. The numbers from
// 0 to 99 are strconv's constants and take no room.
func (t *Text) Int(v int64) string {
	if v >= 0 && v < 100 {
		return strconv.FormatInt(v, 10)
	}
	at := len(t.buf)
	t.buf = strconv.AppendInt(t.buf, v, 10)
	return t.since(at)
}

// Field appends to t the field of a period counter's record for the
// period [start, end), "<start> <end>", and returns it.
func (t *Text) Field(start, end int64) string {
	at := len(t.buf)
	t.buf = strconv.AppendInt(t.buf, start, 10)
	t.buf = append(t.buf, ' ')
	t.buf = strconv.AppendInt(t.buf, end, 10)
	return t.since(at)
}

// since returns the bytes of t from at on as a string that refers to
// them.
func (t *Text) since(at int) string {
	b := t.buf[at:]
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
