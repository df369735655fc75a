use super::*;

/// A frame's header: flags and its 1- or 8-byte length, as ZMTP 3 has it.
fn header(flags: u8, len: u64) -> Vec<u8> {
    let mut bytes = vec![flags];
    if flags & LONG != 0 {
        bytes.extend_from_slice(&len.to_be_bytes());
    } else {
        bytes.push(u8::try_from(len).expect("a short frame"));
    }
    bytes
}

/// A guard past the greeting (fed in two reads).
fn greeted() -> FrameGuard {
    let mut guard = FrameGuard::new();
    let greeting = [0xffu8; GREETING_BYTES as usize];
    assert_eq!(guard.follow(&greeting[..10]), Ok(()));
    assert_eq!(guard.follow(&greeting[10..]), Ok(()));
    guard
}

/// Feeds `len` bytes of a frame's body in reads of at most 64 KiB.
fn body(guard: &mut FrameGuard, len: u64) -> Result<(), u64> {
    let chunk = vec![0u8; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len() as u64);
        guard.follow(&chunk[..n as usize])?;
        left -= n;
    }
    Ok(())
}

/// A whole frame, header then body.
fn frame(guard: &mut FrameGuard, flags: u8, len: u64) -> Result<(), u64> {
    guard.follow(&header(flags, len))?;
    body(guard, len)
}

#[test]
fn messages_under_the_cap_pass_in_one_read_or_byte_by_byte() {
    let mut stream = vec![0xffu8; GREETING_BYTES as usize];
    // A READY command, then a three-frame message with a long frame.
    stream.extend(header(COMMAND, 5));
    stream.extend(b"READY");
    stream.extend(header(MORE, 3));
    stream.extend(b"abc");
    stream.extend(header(MORE | LONG, 300));
    stream.extend(vec![b'x'; 300]);
    stream.extend(header(0, 0));
    assert_eq!(FrameGuard::new().follow(&stream), Ok(()));
    let mut guard = FrameGuard::new();
    for byte in &stream {
        assert_eq!(guard.follow(std::slice::from_ref(byte)), Ok(()));
    }
    assert!(matches!(guard.reading, Reading::Flags), "{guard:?}");
    assert_eq!(guard.message, 0);
}

#[test]
fn a_long_frame_over_the_cap_is_refused_at_its_header_split_across_reads() {
    let mut guard = greeted();
    let len = 256 << 20;
    let header = header(LONG, len);
    assert_eq!(guard.follow(&header[..4]), Ok(()));
    assert_eq!(guard.follow(&header[4..8]), Ok(()));
    assert_eq!(guard.follow(&header[8..]), Err(len + FRAME_COST));
}

#[test]
fn the_frames_of_one_message_count_together_and_the_next_message_starts_afresh() {
    let mut guard = greeted();
    let part = MAX_KERNEL_MESSAGE_BYTES / 2;
    assert_eq!(frame(&mut guard, MORE | LONG, part - FRAME_COST), Ok(()));
    assert_eq!(frame(&mut guard, LONG, part - FRAME_COST), Ok(()));
    // A message exactly at the cap passed; the next starts from nothing.
    assert_eq!(frame(&mut guard, MORE | LONG, part), Ok(()));
    assert_eq!(
        guard.follow(&header(LONG, part)),
        Err(2 * part + 2 * FRAME_COST)
    );
}

#[test]
fn a_message_of_many_empty_frames_is_refused() {
    let mut guard = greeted();
    let frames = MAX_KERNEL_MESSAGE_BYTES / FRAME_COST;
    let empty = header(MORE, 0);
    for _ in 0..frames {
        assert_eq!(guard.follow(&empty), Ok(()));
    }
    assert_eq!(
        guard.follow(&empty),
        Err(MAX_KERNEL_MESSAGE_BYTES + FRAME_COST)
    );
}

#[test]
fn commands_are_capped_alone_and_leave_the_message_under_way_alone() {
    let mut guard = greeted();
    let part = MAX_KERNEL_MESSAGE_BYTES / 2;
    assert_eq!(frame(&mut guard, MORE | LONG, part), Ok(()));
    // A command between its frames neither adds to it nor ends it.
    assert_eq!(frame(&mut guard, COMMAND | LONG, part), Ok(()));
    assert_eq!(
        guard.follow(&header(LONG, part)),
        Err(2 * part + 2 * FRAME_COST)
    );
    let mut guard = greeted();
    assert_eq!(
        guard.follow(&header(COMMAND | LONG, MAX_KERNEL_MESSAGE_BYTES)),
        Err(MAX_KERNEL_MESSAGE_BYTES + FRAME_COST)
    );
}

#[test]
fn a_length_of_all_ones_is_refused_without_overflow() {
    let mut guard = greeted();
    assert_eq!(guard.follow(&header(LONG, u64::MAX)), Err(u64::MAX));
}

/// A relay between a client and a fake kernel listening in a temporary
/// directory: the connected client and the kernel's accepted stream.
async fn relayed(dir: &std::path::Path) -> (UnixStream, UnixStream, JoinSet<()>) {
    let kernel = ConnectionInfo {
        ip: dir.join("k").display().to_string(),
        transport: jupyter_protocol::connection_info::Transport::IPC,
        shell_port: 1,
        iopub_port: 2,
        stdin_port: 3,
        control_port: 4,
        hb_port: 5,
        key: String::new(),
        signature_scheme: "hmac-sha256".into(),
        kernel_name: None,
    };
    let fake = UnixListener::bind(dir.join("k-2")).expect("the fake kernel's socket");
    let mut tasks = JoinSet::new();
    let ours = listen(&kernel, &dir.join("r"), &Weak::new(), &mut tasks).expect("the relay");
    let client = UnixStream::connect(format!("{}-2", ours.ip))
        .await
        .expect("connects to the relay");
    let (theirs, _) = fake.accept().await.expect("the relay reaches the kernel");
    (client, theirs, tasks)
}

#[tokio::test]
async fn the_relay_passes_bytes_both_ways_and_refuses_a_second_client() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut client, mut kernel, _tasks) = relayed(dir.path()).await;
    client.write_all(b"to the kernel").await.expect("sent");
    let mut got = [0u8; 13];
    kernel.read_exact(&mut got).await.expect("relayed");
    assert_eq!(&got, b"to the kernel");
    let mut stream = vec![0xffu8; GREETING_BYTES as usize];
    stream.extend(header(0, 4));
    stream.extend(b"back");
    kernel.write_all(&stream).await.expect("sent");
    let mut got = vec![0u8; stream.len()];
    client.read_exact(&mut got).await.expect("relayed");
    assert_eq!(got, stream);
    assert!(
        UnixStream::connect(dir.path().join("r-2")).await.is_err(),
        "a second connection to the relay was accepted"
    );
}

#[tokio::test]
async fn the_relay_closes_both_sides_on_a_message_over_the_cap() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut client, mut kernel, _tasks) = relayed(dir.path()).await;
    let mut stream = vec![0xffu8; GREETING_BYTES as usize];
    stream.extend(header(MORE, 1));
    stream.push(b'a');
    stream.extend(header(LONG, MAX_KERNEL_MESSAGE_BYTES));
    stream.extend(vec![0u8; 1024]);
    kernel.write_all(&stream).await.expect("sent");
    // The chunk holding the header over the cap is not passed on.
    let mut got = Vec::new();
    client
        .read_to_end(&mut got)
        .await
        .expect("the relay closes");
    assert!(
        got.len() < stream.len() - 1024,
        "{} bytes passed",
        got.len()
    );
    let mut rest = Vec::new();
    let closed = kernel.read_to_end(&mut rest).await;
    assert!(
        closed.is_ok_and(|n| n == 0),
        "the kernel's side is still open"
    );
}
