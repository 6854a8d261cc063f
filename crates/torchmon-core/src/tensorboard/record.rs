//! TensorBoard's record framing (TFRecord): `u64` length (little-endian),
//! masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the data.
//! A reader that meets a record cut short (a writer killed mid-write)
//! stops there: every whole record before it reads.

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one table of 256
/// entries built at compile time: the records are small (one window each)
/// and written on the worker thread, so a table lookup per byte is enough
/// and no dependency is needed.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc = TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The mask TensorFlow applies to a stored CRC, so that a CRC of data that
/// itself holds CRCs does not degenerate (tensorflow/core/lib/hash/crc32c.h).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends `data` framed as one record to `out`.
pub fn append_record(out: &mut Vec<u8>, data: &[u8]) {
    let length = (data.len() as u64).to_le_bytes();
    out.reserve(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    // Values from tensorboard 2.21's own implementation
    // (tensorboard.compat.tensorflow_stub.pywrap_tensorflow.crc32c and
    // masked_crc32c) on the same inputs.
    #[test]
    fn crc32c_known_vectors() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
        assert_eq!(masked_crc32c(&[0u8; 8]), 0x0798_0329);
        assert_eq!(masked_crc32c(&24u64.to_le_bytes()), 0x224b_7fa3);
    }

    #[test]
    fn a_record_is_length_crc_data_crc() {
        let mut out = Vec::new();
        append_record(&mut out, b"123456789");
        assert_eq!(out.len(), 8 + 4 + 9 + 4);
        assert_eq!(&out[..8], &9u64.to_le_bytes());
        assert_eq!(
            &out[8..12],
            &masked_crc32c(&9u64.to_le_bytes()).to_le_bytes()
        );
        assert_eq!(&out[12..21], b"123456789");
        assert_eq!(&out[21..], &0xc78a_b0e5u32.to_le_bytes());
    }
}
