use super::*;

fn ending(forwarded: &[i32]) -> Ending<'_> {
    Ending { forwarded, last_line: Some("Traceback: boom"), ..Ending::default() }
}

#[test]
fn exit_zero_is_ok_even_after_a_forwarded_signal() {
    assert_eq!(classify(Exit::Code(0), &ending(&[])), (RunStatus::Ok, None));
    let (status, message) = classify(Exit::Code(0), &ending(&[libc::SIGUSR1]));
    assert_eq!(status, RunStatus::Ok);
    assert_eq!(message.as_deref(), Some("exited 0 after the worker forwarded SIGUSR1"));
}

#[test]
fn an_oom_is_the_commands_own_line_or_the_oom_killer() {
    let line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
    let e = Ending { oom_line: Some(line), ..ending(&[]) };
    let (status, message) = classify(Exit::Code(1), &e);
    assert_eq!(status, RunStatus::Oom);
    assert!(message.unwrap().ends_with(line));
    let killed = Ending { oom_killed: true, ..ending(&[]) };
    assert_eq!(classify(Exit::Signal(libc::SIGKILL), &killed).0, RunStatus::Oom);
    // A SIGKILL without the cgroup's count rising is someone's kill, not an OOM.
    let (status, message) = classify(Exit::Signal(libc::SIGKILL), &ending(&[]));
    assert_eq!(status, RunStatus::Failed);
    assert_eq!(message.as_deref(), Some("killed by SIGKILL; its last line: Traceback: boom"));
}

#[test]
fn a_sigterm_cancels_and_anything_else_fails_with_its_code() {
    assert_eq!(classify(Exit::Signal(libc::SIGTERM), &ending(&[libc::SIGTERM])).0, RunStatus::Cancelled);
    assert_eq!(classify(Exit::Code(1), &ending(&[libc::SIGTERM])).0, RunStatus::Cancelled);
    let (status, message) = classify(Exit::Code(2), &ending(&[]));
    assert_eq!(status, RunStatus::Failed);
    assert_eq!(message.as_deref(), Some("exit code 2; its last line: Traceback: boom"));
    assert_eq!(exit_code(RunStatus::Failed, Exit::Code(2)), 2);
    assert_eq!(exit_code(RunStatus::Failed, Exit::Signal(libc::SIGSEGV)), 128 + libc::SIGSEGV);
    assert_eq!(exit_code(RunStatus::Oom, Exit::Code(1)), EXIT_OOM);
    assert_eq!(exit_code(RunStatus::Ok, Exit::Code(0)), 0);
}
