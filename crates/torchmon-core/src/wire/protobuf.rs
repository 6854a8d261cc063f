//! The protobuf wire format as torchmon writes it by hand, so that neither
//! a code generator nor `protoc` is needed to build the package: field
//! keys, varints, zigzag, 64- and 32-bit scalars, length-delimited fields,
//! packed repeated fields and nested messages (`Encoder`), and `fields!`,
//! which declares a message's field numbers as constants named after the
//! proto's fields. Each format checks its table against the `.proto` text
//! it was transcribed from (`test_support`), and its Python tests decode
//! its bytes with a real protobuf runtime (docs/internals.md, the module
//! map).
//!
//! Proto3 scalars at their default are left out, as protobuf's own writers
//! leave them out; the `_always` writers are for the fields written even at
//! zero (a oneof member, a value a reader must see to know the kind).

/// The wire types of a field key.
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// Declares a module of field numbers per message, named as in the proto
/// (the constant is the field name in upper case), and, for the test
/// against the proto (`test_support::assert_fields_are_the_protos`), the
/// table `FIELDS` of them all.
macro_rules! fields {
    ($(
        $(#[$doc:meta])*
        mod $module:ident = $message:literal { $($field:ident = $number:literal,)* }
    )*) => {
        $(
            $(#[$doc])*
            mod $module {
                $(pub const $field: u32 = $number;)*
            }
        )*
        /// (message, constant, number) for every constant above.
        #[cfg(test)]
        const FIELDS: &[(&str, &str, u32)] = &[
            $($(($message, stringify!($field), $module::$field),)*)*
        ];
    };
}
pub(crate) use fields;

/// Writes fields at the end of a buffer.
pub struct Encoder<'a>(&'a mut Vec<u8>);

impl<'a> Encoder<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Encoder(out)
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        put_varint(self.0, (u64::from(field) << 3) | u64::from(wire_type));
    }

    /// An unsigned varint (`uint64`, `int64` as its two's complement, an
    /// enum); nothing at 0.
    pub fn varint(&mut self, field: u32, value: u64) {
        if value != 0 {
            self.key(field, VARINT);
            put_varint(self.0, value);
        }
    }

    /// A zigzag varint (`sint32`, `sint64`); nothing at 0.
    pub fn sint(&mut self, field: u32, value: i64) {
        self.varint(field, zigzag(value));
    }

    /// A `double`; nothing at +0.0 (all bits zero: -0.0 is written).
    pub fn double(&mut self, field: u32, value: f64) {
        if value.to_bits() != 0 {
            self.double_always(field, value);
        }
    }

    /// A `double`, written at 0 too.
    pub fn double_always(&mut self, field: u32, value: f64) {
        self.key(field, I64);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// A `float`, written at 0 too.
    pub fn float_always(&mut self, field: u32, value: f32) {
        self.key(field, I32);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// A packed `repeated double`; nothing when empty.
    pub fn packed_doubles(&mut self, field: u32, values: &[f64]) {
        if values.is_empty() {
            return;
        }
        self.key(field, LEN);
        put_varint(self.0, (values.len() * 8) as u64);
        for value in values {
            self.0.extend_from_slice(&value.to_le_bytes());
        }
    }

    /// A packed `repeated sint64`; nothing when empty. The values are read
    /// twice, for the length and then for the bytes, hence `Clone`.
    pub fn packed_sints(&mut self, field: u32, values: impl Iterator<Item = i64> + Clone) {
        let length: usize = values.clone().map(|v| varint_len(zigzag(v))).sum();
        if length == 0 {
            return;
        }
        self.key(field, LEN);
        put_varint(self.0, length as u64);
        for value in values {
            put_varint(self.0, zigzag(value));
        }
    }

    /// A `string` or `bytes` field, written when empty too.
    pub fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, LEN);
        put_varint(self.0, bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    /// A nested message, whose fields `write` writes, written when it has
    /// none too.
    pub fn message(&mut self, field: u32, write: impl FnOnce(&mut Encoder<'_>)) {
        self.key(field, LEN);
        delimited(self.0, write);
    }
}

/// A message whose fields `write` writes, after its length as a varint:
/// a nested message's body, or one message of a delimited stream.
pub fn delimited(out: &mut Vec<u8>, write: impl FnOnce(&mut Encoder<'_>)) {
    // The body is written in place and its length put before it: one move
    // of the body, as many bytes as copying it from a buffer of its own
    // would take, and no buffer per message.
    let start = out.len();
    write(&mut Encoder(out));
    let end = out.len();
    let (prefix, n) = varint_bytes((end - start) as u64);
    out.resize(end + n, 0);
    out.copy_within(start..end, start + n);
    out[start..start + n].copy_from_slice(&prefix[..n]);
}

fn put_varint(out: &mut Vec<u8>, value: u64) {
    let (bytes, n) = varint_bytes(value);
    out.extend_from_slice(&bytes[..n]);
}

/// `value` as a varint: the bytes and how many of them.
fn varint_bytes(mut value: u64) -> ([u8; 10], usize) {
    let mut bytes = [0; 10];
    let mut n = 0;
    while value >= 0x80 {
        bytes[n] = (value as u8) | 0x80;
        value >>= 7;
        n += 1;
    }
    bytes[n] = value as u8;
    (bytes, n + 1)
}

fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// The checks each format's tests run against its `.proto` text and its
/// own source.
#[cfg(test)]
pub mod test_support {
    use std::collections::HashMap;

    /// Per message or enum, each field's or value's number by name, from a
    /// `.proto` text's `<type> <name> = <number>;` and `<NAME> = <number>;`
    /// lines (options in brackets allowed), under the innermost `message` or
    /// `enum` (a `oneof`'s fields are its message's).
    pub fn proto_numbers(text: &str) -> HashMap<(String, String), u32> {
        let mut numbers = HashMap::new();
        let mut scope: Vec<String> = Vec::new();
        for line in text.lines() {
            let line = line.split("//").next().unwrap_or("").trim();
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["message" | "enum", name, "{"] => scope.push((*name).to_owned()),
                ["oneof", _, "{"] => {
                    let message = scope.last().expect("a oneof outside a message").clone();
                    scope.push(message);
                }
                ["}"] => {
                    scope.pop();
                }
                _ if scope.is_empty() => {} // syntax, package, import
                _ => {
                    let Some((declaration, number)) = line.split_once('=') else {
                        continue;
                    };
                    let Some(name) = declaration.split_whitespace().last() else {
                        continue;
                    };
                    let number = number.trim().trim_end_matches(';').split('[').next();
                    let number: u32 =
                        number.unwrap_or("").trim().parse().unwrap_or_else(|_| {
                            panic!("{line:?}: not `<type> <name> = <number>;`")
                        });
                    let message = scope.last().expect("a field outside a message").clone();
                    let previous = numbers.insert((message, name.to_owned()), number);
                    assert!(previous.is_none(), "{line:?} twice");
                }
            }
        }
        assert!(scope.is_empty(), "unbalanced braces");
        assert!(!numbers.is_empty(), "no field read");
        numbers
    }

    /// Every `(message, CONSTANT, number)` of a `fields!` table is the
    /// proto's `message.constant`.
    pub fn assert_fields_are_the_protos(fields: &[(&str, &str, u32)], proto: &str) {
        let numbers = proto_numbers(proto);
        for &(message, constant, number) in fields {
            let name = constant.to_lowercase();
            assert_eq!(
                numbers.get(&(message.to_owned(), name.clone())),
                Some(&number),
                "{message}.{name}"
            );
        }
    }

    /// No `Encoder` call in `source` (a format's file, up to its tests)
    /// takes a bare number as its field: every field goes through a
    /// constant that `assert_fields_are_the_protos` checks.
    pub fn assert_no_bare_field_numbers(source: &str) {
        let code = &source[..source
            .find("#[cfg(test)]\nmod tests")
            .unwrap_or(source.len())];
        for call in [
            ".varint(",
            ".sint(",
            ".double(",
            ".double_always(",
            ".float_always(",
            ".packed_doubles(",
            ".packed_sints(",
            ".bytes(",
            ".message(",
        ] {
            for (at, _) in code.match_indices(call) {
                let argument = code[at + call.len()..].trim_start();
                assert!(
                    !argument.starts_with(|c: char| c.is_ascii_digit()),
                    "a bare field number: {}",
                    &code[at..(at + 40).min(code.len())]
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    fn encoded(write: impl FnOnce(&mut Encoder<'_>)) -> Vec<u8> {
        let mut out = Vec::new();
        write(&mut Encoder::new(&mut out));
        out
    }

    #[test]
    fn varints_and_zigzag() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        assert_eq!(zigzag(-2), 3);
        assert_eq!(zigzag(i64::MIN), u64::MAX);
        for value in [0, 1, 127, 128, 300, 1 << 21, u64::MAX >> 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(varint_len(value), out.len(), "{value}");
        }
    }

    #[test]
    fn defaults_are_left_out_unless_always() {
        assert_eq!(
            encoded(|e| {
                e.varint(1, 0);
                e.sint(2, 0);
                e.double(3, 0.0);
                e.packed_doubles(4, &[]);
                e.packed_sints(5, std::iter::empty());
            }),
            [0u8; 0]
        );
        assert_eq!(
            encoded(|e| e.double(1, -0.0)),
            [0x09, 0, 0, 0, 0, 0, 0, 0, 0x80]
        );
        assert_eq!(
            encoded(|e| e.double_always(1, 0.0)),
            [0x09, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(encoded(|e| e.float_always(2, 0.0)), [0x15, 0, 0, 0, 0]);
        assert_eq!(encoded(|e| e.bytes(3, b"")), [0x1a, 0]);
        assert_eq!(encoded(|e| e.message(3, |_| ())), [0x1a, 0]);
    }

    #[test]
    fn scalars_and_packed_fields() {
        // Field 150 takes a two-byte key; -2 zigzags to 3.
        assert_eq!(encoded(|e| e.varint(150, 1)), [0xb0, 0x09, 0x01]);
        assert_eq!(encoded(|e| e.sint(1, -2)), [0x08, 0x03]);
        assert_eq!(encoded(|e| e.varint(1, u64::MAX)).len(), 11);
        assert_eq!(
            encoded(|e| e.packed_sints(4, [1, -1, 300].into_iter())),
            [0x22, 0x04, 0x02, 0x01, 0xd8, 0x04]
        );
        let mut doubles = vec![0x2a, 16];
        doubles.extend_from_slice(&1.0f64.to_le_bytes());
        doubles.extend_from_slice(&(-2.0f64).to_le_bytes());
        assert_eq!(encoded(|e| e.packed_doubles(5, &[1.0, -2.0])), doubles);
    }

    #[test]
    fn a_nested_message_is_its_bytes_after_their_length() {
        // As `bytes` of the body written on its own, for bodies whose
        // length takes one varint byte and two, nested twice.
        for size in [0, 1, 127, 128, 300] {
            let payload = vec![b'x'; size];
            let inner = encoded(|e| e.bytes(1, &payload));
            let middle = encoded(|e| {
                e.varint(1, 7);
                e.bytes(2, &inner);
            });
            let expected = encoded(|e| {
                e.varint(1, 1);
                e.bytes(2, &middle);
                e.varint(3, 1);
            });
            let nested = encoded(|e| {
                e.varint(1, 1);
                e.message(2, |m| {
                    m.varint(1, 7);
                    m.message(2, |i| i.bytes(1, &payload));
                });
                e.varint(3, 1);
            });
            assert_eq!(nested, expected, "{size}");
            let mut stream = vec![0xff];
            delimited(&mut stream, |e| e.bytes(2, &middle));
            let mut expected = vec![0xff];
            put_varint(
                &mut expected,
                (middle.len() + 1 + varint_len(middle.len() as u64)) as u64,
            );
            expected.extend(encoded(|e| e.bytes(2, &middle)));
            assert_eq!(stream, expected, "{size}");
        }
    }

    #[test]
    fn a_proto_is_read_by_message_with_enums_oneofs_and_options() {
        let proto = "syntax = \"proto3\";\n\
                     package a.b;\n\
                     // message Ignored { int32 x = 9; }\n\
                     message Outer {\n\
                       repeated double d = 3 [packed = true];\n\
                       message Inner {\n\
                         string name = 1; // = 7\n\
                       }\n\
                       oneof kind {\n\
                         float f = 4;\n\
                       }\n\
                       Inner inner = 15;\n\
                     }\n\
                     enum Kind {\n\
                       NONE = 0;\n\
                     }\n";
        let numbers = proto_numbers(proto);
        let number = |message: &str, name: &str| numbers[&(message.to_owned(), name.to_owned())];
        assert_eq!(numbers.len(), 5);
        assert_eq!(number("Outer", "d"), 3);
        assert_eq!(number("Inner", "name"), 1);
        assert_eq!(number("Outer", "f"), 4);
        assert_eq!(number("Outer", "inner"), 15);
        assert_eq!(number("Kind", "NONE"), 0);
        assert_fields_are_the_protos(&[("Outer", "INNER", 15), ("Inner", "NAME", 1)], proto);
        let wrong = std::panic::catch_unwind(|| {
            assert_fields_are_the_protos(&[("Outer", "INNER", 14)], proto)
        });
        assert!(wrong.is_err());
    }

    #[test]
    fn a_bare_field_number_is_found() {
        assert_no_bare_field_numbers("e.varint(event::STEP, 1);");
        for call in [
            "e.varint( 2, 1)",
            "e.message(3, |m| ())",
            "e.double_always(1, x)",
        ] {
            assert!(std::panic::catch_unwind(|| assert_no_bare_field_numbers(call)).is_err());
        }
    }
}
