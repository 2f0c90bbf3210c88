//! The ring entry's send and fail paths, with plain buffers and no ring:
//! a reply written into the entry's buffers, a request rebuilt for fuser's
//! parser, and EIO for every request not served. The kernel's layout is
//! written out here by hand (`include/uapi/linux/fuse.h`), not taken from
//! the module's constants, so that a wrong offset there fails here.

use std::io::IoSlice;

use super::*;
use crate::ll::AnyRequest;

/// `struct fuse_uring_req_header`: `in_out` at 0, `op_in` at 128,
/// `ring_ent_in_out` at 256 (its `commit_id` at +8, `payload_sz` at +16).
const H_OP_IN: usize = 128;
const H_COMMIT_ID: usize = 264;
const H_PAYLOAD_SZ: usize = 272;

const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const WRITE: u32 = 16;
const RELEASE: u32 = 18;
const LOOKUP: u32 = 1;

/// A `struct fuse_in_header`, field by field.
fn in_header(len: u32, opcode: u32, unique: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&opcode.to_ne_bytes());
    b.extend_from_slice(&unique.to_ne_bytes());
    b.extend_from_slice(&42u64.to_ne_bytes()); // nodeid
    b.extend_from_slice(&1000u32.to_ne_bytes()); // uid
    b.extend_from_slice(&1001u32.to_ne_bytes()); // gid
    b.extend_from_slice(&4242u32.to_ne_bytes()); // pid
    b.extend_from_slice(&[0; 4]); // total_extlen, padding
    assert_eq!(b.len(), 40);
    b
}

/// An entry's header as the kernel fills it for a request.
fn header(opcode: u32, unique: u64, op: &[u8], payload_sz: usize, commit_id: u64) -> [u8; HEADER_SIZE] {
    let len = (40 + op.len() + payload_sz) as u32;
    let mut h = [0u8; HEADER_SIZE];
    h[..40].copy_from_slice(&in_header(len, opcode, unique));
    h[H_OP_IN..H_OP_IN + op.len()].copy_from_slice(op);
    h[H_COMMIT_ID..H_COMMIT_ID + 8].copy_from_slice(&commit_id.to_ne_bytes());
    h[H_PAYLOAD_SZ..H_PAYLOAD_SZ + 4].copy_from_slice(&(payload_sz as u32).to_ne_bytes());
    h
}

/// A `struct fuse_out_header`.
fn out_header(len: u32, error: i32, unique: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&len.to_ne_bytes());
    b[4..8].copy_from_slice(&error.to_ne_bytes());
    b[8..].copy_from_slice(&unique.to_ne_bytes());
    b
}

fn error_of(h: &[u8; HEADER_SIZE]) -> i32 {
    i32::from_ne_bytes(h[4..8].try_into().unwrap())
}

fn payload_sz_of(h: &[u8; HEADER_SIZE]) -> u32 {
    u32::from_ne_bytes(h[H_PAYLOAD_SZ..H_PAYLOAD_SZ + 4].try_into().unwrap())
}

fn payload_of(entry: &Entry, n: usize) -> Vec<u8> {
    // SAFETY: the payload area is payload_len bytes; no reply is being written.
    unsafe { std::slice::from_raw_parts(entry.bufs.payload(), n) }.to_vec()
}

fn done(entry: &Entry) -> bool {
    entry.replied.lock().unwrap().done
}

/// A GETATTR's op header (`struct fuse_getattr_in`: 16 bytes).
const GETATTR_IN: [u8; 16] = [1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0];

#[test]
fn a_reply_that_fits_goes_to_the_header_and_the_payload() {
    let mut h = [0xAAu8; HEADER_SIZE];
    let mut payload = [0u8; 8];
    let out = out_header(16 + 5, 0, 7);
    // The out header split over two slices, the data over two more.
    write_reply(
        &mut h,
        &mut payload,
        &[IoSlice::new(&out[..10]), IoSlice::new(&out[10..]), IoSlice::new(b"hel"), IoSlice::new(b"lo")],
    );
    assert_eq!(h[..16], out);
    assert_eq!(payload_sz_of(&h), 5);
    assert_eq!(&payload[..5], b"hello");
    // Nothing else of the header is written.
    assert!(h[16..H_PAYLOAD_SZ].iter().all(|&b| b == 0xAA));
    assert!(h[H_PAYLOAD_SZ + 4..].iter().all(|&b| b == 0xAA));

    // A reply of exactly the payload's size fits too.
    let mut payload = [0u8; 5];
    write_reply(&mut h, &mut payload, &[IoSlice::new(&out), IoSlice::new(b"hello")]);
    assert_eq!((error_of(&h), payload_sz_of(&h)), (0, 5));
    assert_eq!(&payload, b"hello");
}

#[test]
fn a_reply_longer_than_the_payload_is_eio_without_payload() {
    let mut h = [0u8; HEADER_SIZE];
    let mut payload = [0u8; 4];
    let out = out_header(16 + 5, 0, 7);
    write_reply(&mut h, &mut payload, &[IoSlice::new(&out), IoSlice::new(b"hello")]);
    assert_eq!(error_of(&h), -libc::EIO);
    assert_eq!(u64::from_ne_bytes(h[8..16].try_into().unwrap()), 7, "the request's unique kept");
    assert_eq!(payload_sz_of(&h), 0);
}

#[test]
fn an_error_reply_is_its_header_alone() {
    let mut h = [0u8; HEADER_SIZE];
    let mut payload = [0xAAu8; 8];
    let out = out_header(16, -libc::ENOENT, 9);
    write_reply(&mut h, &mut payload, &[IoSlice::new(&out)]);
    assert_eq!(h[..16], out);
    assert_eq!(payload_sz_of(&h), 0);
    assert_eq!(payload, [0xAA; 8]);
}

#[test]
fn a_second_or_late_reply_is_dropped() {
    let entry = Entry::new(64).unwrap();
    let first = entry.begin();
    let ok = out_header(16, 0, 1);
    entry.send(first, &[IoSlice::new(&ok)]).unwrap();
    assert!(done(&entry));
    let again = out_header(16, -libc::EPERM, 1);
    assert!(entry.send(first, &[IoSlice::new(&again)]).is_err());
    assert_eq!(entry.bufs.read_header()[..16], ok);

    // The next request: the first one's late reply is not written over it.
    let next = entry.begin();
    assert!(!done(&entry));
    assert!(entry.send(first, &[IoSlice::new(&again)]).is_err());
    assert!(!done(&entry));
    let reply = out_header(16 + 2, 0, 2);
    entry.send(next, &[IoSlice::new(&reply), IoSlice::new(b"ok")]).unwrap();
    let h = entry.bufs.read_header();
    assert_eq!(h[..16], reply);
    assert_eq!(payload_sz_of(&h), 2);
    assert_eq!(payload_of(&entry, 2), b"ok");
}

#[test]
fn the_header_is_read_as_the_kernel_wrote_it() {
    let h = header(WRITE, 77, &[0; 40], 5, 0x0123_4567_89ab_cdef);
    let head = Head::read(&h);
    assert_eq!(
        head,
        Head {
            unique: 77,
            commit_id: 0x0123_4567_89ab_cdef,
            len: 85,
            payload_sz: 5,
        }
    );
    assert_eq!(head.op_len(5), Some(40));
    // Sizes that disagree: malformed.
    assert_eq!(head.op_len(4), None, "a payload larger than the entry's");
    let mut short = h;
    short[..4].copy_from_slice(&30u32.to_ne_bytes());
    assert_eq!(Head::read(&short).op_len(64), None, "shorter than an in-header");
    short[..4].copy_from_slice(&44u32.to_ne_bytes());
    assert_eq!(Head::read(&short).op_len(64), None, "shorter than its payload");
    let mut long = h;
    long[..4].copy_from_slice(&(40 + 129 + 5u32).to_ne_bytes());
    assert_eq!(Head::read(&long).op_len(64), None, "an op header larger than its area");
}

#[test]
fn a_request_without_payload_is_rebuilt_in_place_byte_for_byte() {
    let h = header(GETATTR, 5, &GETATTR_IN, 0, 1);
    let head = Head::read(&h);
    let op_len = head.op_len(64).unwrap();
    let mut prefix_words = vec![0u64; PREFIX / 8];
    let prefix = prefix_words.as_mut_bytes();
    let end = prefix.as_ptr_range().end;
    let mut copy = Vec::new();
    let data = rebuild(&h, &head, op_len, prefix, &[0xAA; 64], &mut copy);
    let mut want = in_header(56, GETATTR, 5);
    want.extend_from_slice(&GETATTR_IN);
    assert_eq!(data, &want[..]);
    assert_eq!(data.as_ptr_range().end, end, "at the end of the prefix");
    // fuser's parser reads it as the request it is.
    let req = AnyRequest::try_from(data).unwrap();
    assert_eq!((req.unique().0, req.nodeid().0), (5, 42));
    assert!(matches!(req.operation(), Ok(Operation::GetAttr(_))));
    assert!(copy.is_empty(), "not copied");
}

#[test]
fn a_request_with_payload_is_copied_byte_for_byte() {
    let mut write_in = [0u8; 40];
    write_in[16..20].copy_from_slice(&5u32.to_ne_bytes()); // size
    let h = header(WRITE, 6, &write_in, 5, 1);
    let head = Head::read(&h);
    let op_len = head.op_len(64).unwrap();
    let mut prefix = vec![0u8; PREFIX];
    let mut payload = vec![0u8; 64];
    payload[..5].copy_from_slice(b"hello");
    let mut copy = Vec::new();
    let data = rebuild(&h, &head, op_len, &mut prefix, &payload, &mut copy);
    let mut want = in_header(85, WRITE, 6);
    want.extend_from_slice(&write_in);
    want.extend_from_slice(b"hello");
    assert_eq!(data, &want[..]);
    let req = AnyRequest::try_from(data).unwrap();
    match req.operation() {
        Ok(Operation::Write(w)) => assert_eq!(w.data(), b"hello"),
        other => panic!("not a write: {other:?}"),
    }
    assert!(prefix.iter().all(|&b| b == 0), "the prefix is left alone");
}

#[test]
fn the_quick_policy_sees_the_opcode_and_an_opens_flags() {
    let flags = libc::O_WRONLY | libc::O_TRUNC;
    let h = header(OPEN, 1, &[&flags.to_ne_bytes()[..], &[0; 4]].concat(), 0, 1);
    assert_eq!(
        UringRequest::read(&h),
        UringRequest {
            opcode: OPEN,
            flags: Some(OpenFlags(flags)),
        }
    );
    // `struct fuse_release_in`: fh, then flags.
    let release_in = [&[9u8; 8][..], &flags.to_ne_bytes(), &[0; 12]].concat();
    let h = header(RELEASE, 1, &release_in, 0, 1);
    assert_eq!(UringRequest::read(&h).flags, Some(OpenFlags(flags)));
    let h = header(LOOKUP, 1, &[], 4, 1);
    assert_eq!(
        UringRequest::read(&h),
        UringRequest {
            opcode: LOOKUP,
            flags: None,
        }
    );
}

/// Serves `h` in a fresh entry with `dispatch`; returns the entry's header
/// afterwards, and checks the request was committed (answered).
fn serve(
    h: &[u8; HEADER_SIZE],
    session: Option<()>,
    dispatch: impl FnOnce(&Entry, &[u8], u64) -> bool,
) -> [u8; HEADER_SIZE] {
    let entry = Entry::new(64).unwrap();
    let mut copy = Vec::new();
    let ids = serve_request(&entry, h, session, &mut copy, 0, |(), data, generation| {
        dispatch(&entry, data, generation)
    });
    assert_eq!(ids, (Head::read(h).unique, Head::read(h).commit_id));
    assert!(done(&entry), "every request is answered");
    entry.bufs.read_header()
}

fn assert_eio(h: &[u8; HEADER_SIZE], unique: u64) {
    assert_eq!(h[..16], out_header(16, -libc::EIO, unique));
    assert_eq!(payload_sz_of(h), 0);
}

#[test]
fn a_request_served_gets_its_handlers_reply() {
    let h = header(GETATTR, 11, &GETATTR_IN, 0, 3);
    let reply = out_header(16, -libc::ENOENT, 11);
    let got = serve(&h, Some(()), |entry, data, generation| {
        assert_eq!(&data[..40], &h[..40]);
        entry.send(generation, &[IoSlice::new(&reply)]).unwrap();
        true
    });
    assert_eq!(got[..16], reply);
}

#[test]
fn a_handler_that_panics_is_answered_eio() {
    let h = header(GETATTR, 12, &GETATTR_IN, 0, 3);
    let got = serve(&h, Some(()), |_, _, _| panic!("a handler's bug (this panic is the test's)"));
    assert_eio(&got, 12);
    // One that replied before it panicked keeps its reply.
    let reply = out_header(16, 0, 12);
    let got = serve(&h, Some(()), |entry, _, generation| {
        entry.send(generation, &[IoSlice::new(&reply)]).unwrap();
        panic!("a handler's bug after its reply (this panic is the test's)")
    });
    assert_eq!(got[..16], reply);
}

#[test]
fn a_request_fuser_cannot_parse_is_answered_eio() {
    let h = header(GETATTR, 13, &GETATTR_IN, 0, 3);
    // fuser's parser refuses fewer bytes than an in-header.
    let got = serve(&h, Some(()), |_, data, _| AnyRequest::try_from(&data[..39]).is_ok());
    assert_eio(&got, 13);
}

#[test]
fn a_request_for_a_session_gone_is_answered_eio() {
    let h = header(GETATTR, 14, &GETATTR_IN, 0, 3);
    let got = serve(&h, None, |_, _, _| unreachable!("no session to dispatch to"));
    assert_eio(&got, 14);
}

#[test]
fn a_malformed_request_is_answered_eio() {
    let mut h = header(GETATTR, 15, &GETATTR_IN, 0, 3);
    h[H_PAYLOAD_SZ..H_PAYLOAD_SZ + 4].copy_from_slice(&65u32.to_ne_bytes());
    let got = serve(&h, Some(()), |_, _, _| unreachable!("not dispatched"));
    assert_eio(&got, 15);
}

#[test]
fn the_callback_decides_which_requests_are_quick() {
    fn reads(r: UringRequest) -> bool {
        r.opcode == GETATTR
    }
    fn panics(_: UringRequest) -> bool {
        panic!("a policy's bug (this panic is the test's)")
    }
    let quick = |q: Option<fn(UringRequest) -> bool>, opcode| is_quick(q, &header(opcode, 1, &[], 0, 1));
    assert!(quick(Some(reads), GETATTR));
    assert!(!quick(Some(reads), WRITE));
    assert!(!quick(None, GETATTR), "no callback: nothing is quick");
    assert!(!quick(Some(panics), GETATTR));
}
