//! Just enough of the DNS wire format (RFC 1035 §4.1) for the relay to know that what a
//! guest sent is one standard query and what a resolver sent back answers it, and to
//! answer REFUSED itself.
//!
//! A query is accepted when its header says query (QR=0, OPCODE=0), it asks exactly one
//! question, and that question's name (labels of 1..=63 bytes, at most 255 bytes in all,
//! no compression pointers: a query has nothing to point back to) and its type and class
//! fit in the message. Whatever follows the question (an EDNS OPT record) is the
//! resolver's business.

/// Length of the fixed header.
pub const HEADER_LEN: usize = 12;
/// Longest name on the wire.
const MAX_NAME: usize = 255;
/// RCODE 5: the server refuses to answer.
const RCODE_REFUSED: u8 = 5;

/// Why bytes are not a query the relay passes on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MessageError {
    /// Fewer bytes than a header and one question need.
    #[error("too short for a DNS query")]
    Short,
    /// A response, or an opcode other than QUERY.
    #[error("not a standard query")]
    NotAQuery,
    /// Not exactly one question.
    #[error("a query must ask exactly one question")]
    QuestionCount,
    /// A label over 63 bytes, a name over 255, or a compression pointer.
    #[error("malformed question name")]
    BadName,
}

/// A checked query: its id and where its question ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Offset just past QTYPE and QCLASS.
    question_end: usize,
}

impl Query {
    /// Check `msg` as a standard query with one question.
    pub fn parse(msg: &[u8]) -> Result<Query, MessageError> {
        if msg.len() < HEADER_LEN + 5 {
            return Err(MessageError::Short);
        }
        let (flags_hi, qdcount) = (msg[2], u16::from_be_bytes([msg[4], msg[5]]));
        // QR is the top bit, OPCODE the next four.
        if flags_hi & 0x80 != 0 || (flags_hi >> 3) & 0x0f != 0 {
            return Err(MessageError::NotAQuery);
        }
        if qdcount != 1 {
            return Err(MessageError::QuestionCount);
        }
        let mut at = HEADER_LEN;
        loop {
            let len = usize::from(*msg.get(at).ok_or(MessageError::Short)?);
            if len == 0 {
                at += 1;
                break;
            }
            if len > 63 {
                return Err(MessageError::BadName);
            }
            at += 1 + len;
            if at - HEADER_LEN > MAX_NAME {
                return Err(MessageError::BadName);
            }
        }
        let question_end = at + 4;
        if question_end > msg.len() {
            return Err(MessageError::Short);
        }
        Ok(Query { id: u16::from_be_bytes([msg[0], msg[1]]), question_end })
    }

    /// The REFUSED answer to `msg` (which [`Query::parse`] accepted as `self`): its header
    /// and question, QR set, RD kept, no records.
    pub fn refused(&self, msg: &[u8]) -> Vec<u8> {
        let mut out = msg[..self.question_end].to_vec();
        out[2] = 0x80 | (msg[2] & 0x01);
        out[3] = RCODE_REFUSED;
        // One question; no answer, authority or additional records.
        out[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        out
    }

    /// The question's name (lowercase, dotted, no trailing dot) of `msg`, which
    /// [`Query::parse`] accepted.
    pub fn name(&self, msg: &[u8]) -> String {
        let mut labels = vec![];
        let mut at = HEADER_LEN;
        while let Some(&len) = msg.get(at) {
            let len = usize::from(len);
            if len == 0 || at + 1 + len > msg.len() {
                break;
            }
            labels.push(String::from_utf8_lossy(&msg[at + 1..at + 1 + len]).to_ascii_lowercase());
            at += 1 + len;
        }
        labels.join(".")
    }

    /// Whether `answer` is a response to this query (same id, QR set).
    pub fn is_answered_by(&self, answer: &[u8]) -> bool {
        answer.len() >= HEADER_LEN && answer[..2] == self.id.to_be_bytes() && answer[2] & 0x80 != 0
    }
}

/// A standard query for the A records of `name` (dotted); `None` when a label is empty or
/// longer than 63 bytes, or the name longer than 255.
pub fn a_query(id: u16, name: &str) -> Option<Vec<u8>> {
    let mut m = id.to_be_bytes().to_vec();
    // RD; one question.
    m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        let len = u8::try_from(label.len()).ok().filter(|l| (1..=63).contains(l))?;
        m.push(len);
        m.extend_from_slice(label.as_bytes());
    }
    m.push(0);
    if m.len() - HEADER_LEN > MAX_NAME {
        return None;
    }
    m.extend_from_slice(&[0, 1, 0, 1]);
    Some(m)
}

/// The IPv4 addresses in the answer section of response `msg` (A records of class IN,
/// whatever name they belong to: a CNAME chain ends in them).
pub fn a_records(msg: &[u8]) -> Vec<std::net::Ipv4Addr> {
    let read_u16 = |at: usize| msg.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let (Some(qdcount), Some(ancount)) = (read_u16(4), read_u16(6)) else { return vec![] };
    let mut at = HEADER_LEN;
    let mut out = vec![];
    for _ in 0..qdcount {
        let Some(end) = skip_name(msg, at) else { return out };
        at = end + 4;
    }
    for _ in 0..ancount {
        let Some(end) = skip_name(msg, at) else { return out };
        let (Some(rtype), Some(class), Some(rdlen)) = (read_u16(end), read_u16(end + 2), read_u16(end + 8)) else {
            return out;
        };
        let data = end + 10;
        let Some(rdata) = msg.get(data..data + usize::from(rdlen)) else { return out };
        if rtype == 1 && class == 1 && rdata.len() == 4 {
            out.push(std::net::Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]));
        }
        at = data + usize::from(rdlen);
    }
    out
}

/// Where the name at `at` ends (labels up to the root, or up to a compression pointer).
fn skip_name(msg: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return Some(at + 2),
            l if l > 63 => return None,
            l => at += 1 + usize::from(l),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A query for `name` (dotted), type A, class IN, with `id`.
    pub(crate) fn query(id: u16, name: &str) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.split('.').filter(|l| !l.is_empty()) {
            m.push(u8::try_from(label.len()).unwrap());
            m.extend_from_slice(label.as_bytes());
        }
        m.extend_from_slice(&[0, 0, 1, 0, 1]);
        m
    }

    #[test]
    fn one_standard_question_passes_and_anything_else_does_not() {
        let q = query(0x1234, "registry.example.");
        assert_eq!(Query::parse(&q).unwrap().id, 0x1234);
        let mut with_opt = q.clone();
        with_opt.extend_from_slice(&[0, 0, 41, 4, 208, 0, 0, 0, 0, 0, 0]);
        assert!(Query::parse(&with_opt).is_ok());

        assert_eq!(Query::parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Err(MessageError::NotAQuery));
        assert_eq!(Query::parse(&q[..10]), Err(MessageError::Short));
        assert_eq!(Query::parse(&q[..q.len() - 2]), Err(MessageError::Short));
        let mut response = q.clone();
        response[2] |= 0x80;
        assert_eq!(Query::parse(&response), Err(MessageError::NotAQuery));
        let mut two = q.clone();
        two[5] = 2;
        assert_eq!(Query::parse(&two), Err(MessageError::QuestionCount));
        let mut pointer = q.clone();
        pointer[12] = 0xc0;
        assert_eq!(Query::parse(&pointer), Err(MessageError::BadName));
        let long = format!("{}.example", "b.".repeat(130));
        assert_eq!(Query::parse(&query(1, &long)), Err(MessageError::BadName));
    }

    #[test]
    fn refused_answers_the_question_with_no_records() {
        let q = query(7, "a.example");
        let parsed = Query::parse(&q).unwrap();
        let r = parsed.refused(&q);
        assert_eq!(&r[..2], &[0, 7]);
        assert_eq!(r[2] & 0x80, 0x80, "QR set");
        assert_eq!(r[3] & 0x0f, RCODE_REFUSED);
        assert_eq!(&r[4..12], &[0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&r[12..], &q[12..]);
        assert!(parsed.is_answered_by(&r));
        assert!(!parsed.is_answered_by(&q));
    }

    #[test]
    fn names_queries_and_a_records_round_trip() {
        let q = a_query(5, "Registry.Example.").unwrap();
        let parsed = Query::parse(&q).unwrap();
        assert_eq!(parsed.name(&q), "registry.example");
        assert!(a_query(1, "a..b").is_none() && a_query(1, &"x".repeat(64)).is_none());
        // An answer: a CNAME (to a compressed name), then two A records.
        let mut r = q.clone();
        r[2] = 0x81;
        r[3] = 0x80;
        r[6..8].copy_from_slice(&[0, 3]);
        r.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 4, 1, b'c', 0xc0, 12]);
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 203, 0, 113, 5]);
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 203, 0, 113, 6]);
        assert_eq!(
            a_records(&r),
            ["203.0.113.5".parse::<std::net::Ipv4Addr>().unwrap(), "203.0.113.6".parse().unwrap()]
        );
        assert!(a_records(&r[..r.len() - 3]).len() == 1, "a truncated record is not read");
    }
}
