//! Thread priority for background work: the event log's threads run only
//! when nothing else wants the CPU, so a DHCP reply never waits behind them.

/// How many steps nicer than the rest the event log's threads run where
/// `SCHED_IDLE` is refused (see [`lower_this_thread`]).
pub(crate) const BACKGROUND_NICE: i32 = 10;

/// Linux's `SCHED_IDLE` policy number, as /proc/PID/stat shows it.
#[cfg(test)]
pub(crate) const SCHED_IDLE: i64 = 5;

/// Makes the calling thread [`BACKGROUND_NICE`] steps nicer: it gets a
/// tenth of the CPU a normal thread gets when they compete, and never
/// none. For the discovery pool's thread: a flood of unknown machines
/// then costs the known ones little, and the pool, which commits leases
/// (holding SQLite's write lock meanwhile), is never starved the way
/// `SCHED_IDLE` could starve it.
pub(crate) fn nicer_this_thread() {
    let me = rustix::thread::gettid();
    let base = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
    let nice = (base + BACKGROUND_NICE).min(19);
    if let Err(e) = rustix::process::setpriority_process(Some(me), nice) {
        tracing::debug!(error = %e, "cannot lower a thread's priority");
    }
}

/// Puts the calling thread (and the threads it starts from now on) under
/// `SCHED_IDLE`, for the event log's work: it then runs only when nothing
/// else wants the CPU, and a DHCP packet's wake-up preempts it at once.
/// Nice 10 (the fallback, where the policy is refused) still left the DHCP
/// thread waiting in the run queue: pinned to one core at 20000-24000
/// DORA/s with 100k machines, the DHCP thread's run-queue wait was 93-169
/// ms per 2 s step at nice 10 and 23-40 ms under SCHED_IDLE (8-31 with the
/// event log off), and the reply p99 0.51-1.11 ms against 0.23-0.53 ms
/// (BENCHMARKS.md). A starved writer delays only events: the queue drops
/// and counts what does not fit, and the log's own file ([`crate::events::log::FILE`])
/// keeps its write lock away from the store.
pub(crate) fn lower_this_thread() {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };
    let me = rustix::thread::gettid();
    let base = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
    if let Err(e) = set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Min,
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
    ) {
        tracing::debug!(error = ?e, "SCHED_IDLE refused for a background thread");
    }
    // Also nicer, for where SCHED_IDLE was refused (under it, nice is not
    // used); the call above may have reset it.
    let nice = (base + BACKGROUND_NICE).min(19);
    if let Err(e) = rustix::process::setpriority_process(Some(me), nice) {
        tracing::debug!(error = %e, "cannot lower a background thread's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nicer_thread_is_nicer_and_the_others_are_not() {
        let me = || rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let ours = me();
        let theirs = std::thread::spawn(move || {
            nicer_this_thread();
            me()
        })
        .join()
        .unwrap();
        assert_eq!(theirs, (ours + BACKGROUND_NICE).min(19));
        assert_eq!(me(), ours, "only the calling thread");
    }
}
