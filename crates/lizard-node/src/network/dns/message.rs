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

    /// Whether `answer` is a response to this query (same id, QR set).
    pub fn is_answered_by(&self, answer: &[u8]) -> bool {
        answer.len() >= HEADER_LEN && answer[..2] == self.id.to_be_bytes() && answer[2] & 0x80 != 0
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
}
