//! The pickle subset PyTorch's flight recorder writes (`torch::jit::Pickler`, protocol 2, plain
//! dicts, lists, tuples, strings, numbers, bools and None, shared values memoised), read into a
//! `serde_json::Value` so that the pickle and the JSON dump deserialise through one set of types.
//!
//! Ours rather than `serde-pickle`'s: that crate (1.2) refuses these dumps ("recursive structure
//! found") as soon as one memoised string is fetched a third time, which every dump does. Objects
//! live in an arena and containers hold indices, so a memoised dict filled after it was memoised
//! is seen filled wherever it is fetched. GLOBAL, REDUCE and the other opcodes that build objects
//! of a class are refused by name: a dump never has them, and nothing here runs code.
use serde_json::{Map, Number, Value};
use std::collections::HashMap;

/// Deeper nesting than any dump has (a dump is 4 levels deep): refused, never recursed into.
const MAX_DEPTH: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    #[error("ends at byte {0} in the middle of an opcode or before STOP")]
    Truncated(usize),
    #[error("opcode {opcode:#04x} at byte {at} is not one a flight-recorder dump uses (plain dicts, lists, tuples, strings, numbers only)")]
    Unsupported { opcode: u8, at: usize },
    #[error("malformed at byte {at}: {what}")]
    Malformed { at: usize, what: &'static str },
}

enum Node {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
}

#[derive(Clone, Copy)]
enum Slot {
    Mark,
    Obj(usize),
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    stack: Vec<Slot>,
    memo: HashMap<u32, usize>,
}

/// Reads one pickle; the value its STOP leaves on the stack.
pub fn read(bytes: &[u8]) -> Result<Value, PickleError> {
    let mut r = Reader { bytes, pos: 0, nodes: Vec::new(), stack: Vec::new(), memo: HashMap::new() };
    let top = r.run()?;
    r.value(top, 0)
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len()).ok_or(PickleError::Truncated(self.pos))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn push(&mut self, node: Node) {
        self.nodes.push(node);
        self.stack.push(Slot::Obj(self.nodes.len() - 1));
    }

    fn malformed(&self, what: &'static str) -> PickleError {
        PickleError::Malformed { at: self.pos, what }
    }

    fn pop(&mut self) -> Result<usize, PickleError> {
        match self.stack.pop() {
            Some(Slot::Obj(i)) => Ok(i),
            _ => Err(self.malformed("an object was expected on the stack")),
        }
    }

    fn top(&self) -> Result<usize, PickleError> {
        match self.stack.last() {
            Some(Slot::Obj(i)) => Ok(*i),
            _ => Err(self.malformed("an object was expected on the stack")),
        }
    }

    /// The objects above the topmost mark, the mark removed.
    fn pop_mark(&mut self) -> Result<Vec<usize>, PickleError> {
        let at = self.stack.iter().rposition(|s| matches!(s, Slot::Mark)).ok_or(self.malformed("no MARK"))?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items.into_iter().map(|s| if let Slot::Obj(i) = s { i } else { 0 }).collect())
    }

    fn string(&mut self, n: usize) -> Result<(), PickleError> {
        let at = self.pos;
        let s = std::str::from_utf8(self.take(n)?)
            .map_err(|_| PickleError::Malformed { at, what: "a string that is not UTF-8" })?
            .to_string();
        self.push(Node::Str(s));
        Ok(())
    }

    fn memo_put(&mut self, id: u32) -> Result<(), PickleError> {
        let top = self.top()?;
        self.memo.insert(id, top);
        Ok(())
    }

    fn memo_get(&mut self, id: u32) -> Result<(), PickleError> {
        let i = *self.memo.get(&id).ok_or(self.malformed("a memo fetch of a value never put"))?;
        self.stack.push(Slot::Obj(i));
        Ok(())
    }

    fn run(&mut self) -> Result<usize, PickleError> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?; // PROTO n
                }
                0x95 => {
                    self.take(8)?; // FRAME (protocol 4): only a length hint
                }
                b'.' => return self.pop(),
                b'(' => self.stack.push(Slot::Mark),
                b'}' => self.push(Node::Dict(Vec::new())),
                b']' => self.push(Node::List(Vec::new())),
                b')' => self.push(Node::Tuple(Vec::new())),
                b'N' => self.push(Node::None),
                0x88 => self.push(Node::Bool(true)),
                0x89 => self.push(Node::Bool(false)),
                b'K' => {
                    let v = self.u8()? as i64;
                    self.push(Node::Int(v));
                }
                b'M' => {
                    let b = self.take(2)?;
                    let v = u16::from_le_bytes([b[0], b[1]]) as i64;
                    self.push(Node::Int(v));
                }
                b'J' => {
                    let v = self.u32()? as i32 as i64;
                    self.push(Node::Int(v));
                }
                0x8a => {
                    // LONG1: n bytes of little-endian two's complement.
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    if n > 8 {
                        return Err(self.malformed("an integer wider than 64 bits"));
                    }
                    let mut v: i64 = 0;
                    for (k, byte) in b.iter().enumerate() {
                        v |= (*byte as i64) << (8 * k);
                    }
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.push(Node::Int(v));
                }
                b'G' => {
                    let b = self.take(8)?;
                    let v = f64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                    self.push(Node::Float(v));
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    self.string(n)?;
                }
                0x8c => {
                    let n = self.u8()? as usize; // SHORT_BINUNICODE (protocol 4)
                    self.string(n)?;
                }
                b'q' => {
                    let id = self.u8()? as u32;
                    self.memo_put(id)?;
                }
                b'r' => {
                    let id = self.u32()?;
                    self.memo_put(id)?;
                }
                0x94 => {
                    let id = self.memo.len() as u32; // MEMOIZE (protocol 4)
                    self.memo_put(id)?;
                }
                b'h' => {
                    let id = self.u8()? as u32;
                    self.memo_get(id)?;
                }
                b'j' => {
                    let id = self.u32()?;
                    self.memo_get(id)?;
                }
                b'a' => {
                    let item = self.pop()?;
                    self.extend(vec![item])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.extend(items)?;
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    self.set(vec![key, value])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set(items)?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Node::Tuple(items));
                }
                _ => return Err(PickleError::Unsupported { opcode: op, at }),
            }
        }
    }

    fn extend(&mut self, items: Vec<usize>) -> Result<(), PickleError> {
        let target = self.top()?;
        match &mut self.nodes[target] {
            Node::List(l) => {
                l.extend(items);
                Ok(())
            }
            _ => Err(self.malformed("APPEND onto something that is not a list")),
        }
    }

    fn set(&mut self, items: Vec<usize>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.malformed("SETITEMS with a key and no value"));
        }
        let target = self.top()?;
        match &mut self.nodes[target] {
            Node::Dict(d) => {
                d.extend(items.chunks(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            _ => Err(self.malformed("SETITEM onto something that is not a dict")),
        }
    }

    fn value(&self, i: usize, depth: usize) -> Result<Value, PickleError> {
        if depth > MAX_DEPTH {
            return Err(self.malformed("nested deeper than any dump (or a cycle)"));
        }
        Ok(match &self.nodes[i] {
            Node::None => Value::Null,
            Node::Bool(b) => Value::Bool(*b),
            Node::Int(v) => Value::Number((*v).into()),
            Node::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Node::Str(s) => Value::String(s.clone()),
            Node::List(items) | Node::Tuple(items) => {
                Value::Array(items.iter().map(|k| self.value(*k, depth + 1)).collect::<Result<_, _>>()?)
            }
            Node::Dict(pairs) => {
                let mut map = Map::new();
                for (k, v) in pairs {
                    let key = match &self.nodes[*k] {
                        Node::Str(s) => s.clone(),
                        Node::Int(n) => n.to_string(),
                        _ => return Err(self.malformed("a dict key that is neither a string nor an integer")),
                    };
                    map.insert(key, self.value(*v, depth + 1)?);
                }
                Value::Object(map)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memoised_dict_filled_after_its_put_is_seen_filled_where_fetched() {
        // {'a': d, 'b': d} with d = {'k': 1} memoised empty, then filled.
        let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00a}q\x01X\x01\x00\x00\x00kK\x01sX\x01\x00\x00\x00bh\x01u.";
        let v = read(p).expect("reads");
        assert_eq!(v, serde_json::json!({"a": {"k": 1}, "b": {"k": 1}}));
    }

    #[test]
    fn numbers_tuples_and_none_read_as_python_wrote_them() {
        // (-1, 300, 2**40, -2**40, 1.5, None, True) via BININT, BININT2, LONG1, BINFLOAT.
        let p = b"\x80\x02(J\xff\xff\xff\xffM,\x01\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xffG?\xf8\x00\x00\x00\x00\x00\x00N\x88t.";
        let v = read(p).expect("reads");
        assert_eq!(v, serde_json::json!([-1, 300, 1u64 << 40, -(1i64 << 40), 1.5, null, true]));
    }

    #[test]
    fn code_and_truncation_are_refused_with_the_byte() {
        let e = read(b"\x80\x02cos\nsystem\n.").expect_err("GLOBAL").to_string();
        assert!(e.contains("0x63") && e.contains("byte 2"), "{e}");
        let e = read(b"\x80\x02X\x10\x00\x00\x00ab").expect_err("short").to_string();
        assert!(e.contains("ends at byte"), "{e}");
        assert!(read(b"\x80\x02u.").is_err(), "SETITEMS with no mark");
    }
}
