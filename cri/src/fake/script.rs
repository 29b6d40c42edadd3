//! What a test scripts in the fake runtime: how containers exit and what
//! ExecSync answers.

use std::time::Duration;

/// How a container's process ends, scripted by the test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitScript {
    /// The process's exit code.
    pub exit_code: i32,
    /// The reason ContainerStatus reports: `"OOMKilled"`, or `None` for
    /// containerd's default (`"Completed"` for 0, `"Error"` otherwise).
    pub reason: Option<String>,
    /// The message ContainerStatus reports.
    pub message: String,
    /// How long after StartContainer the process exits.
    pub after: Duration,
}

impl ExitScript {
    /// Exits with `exit_code` `after` the start (default reason).
    pub fn code(exit_code: i32, after: Duration) -> Self {
        ExitScript {
            exit_code,
            reason: None,
            message: String::new(),
            after,
        }
    }

    /// Killed by the OOM killer `after` the start: exit code 137, reason
    /// `OOMKilled`, as containerd reports it.
    pub fn oom_killed(after: Duration) -> Self {
        ExitScript {
            exit_code: 137,
            reason: Some("OOMKilled".to_string()),
            message: String::new(),
            after,
        }
    }
}

/// What ExecSync answers for one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecScript {
    /// The command line to match exactly.
    pub cmd: Vec<String>,
    /// Only for containers with this name (`None`: any container).
    pub container: Option<String>,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// Exit code.
    pub exit_code: i32,
    /// How long the command runs. Past the request's timeout, ExecSync
    /// fails with DeadlineExceeded after that timeout, like containerd.
    pub duration: Duration,
}

impl ExecScript {
    /// `cmd` in any container prints `stdout` and exits with `exit_code`.
    pub fn new(cmd: &[&str], stdout: &str, exit_code: i32) -> Self {
        ExecScript {
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            container: None,
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
            exit_code,
            duration: Duration::ZERO,
        }
    }

    /// Only in containers named `name`.
    pub fn in_container(mut self, name: &str) -> Self {
        self.container = Some(name.to_string());
        self
    }

    /// With this standard error.
    pub fn with_stderr(mut self, stderr: &str) -> Self {
        self.stderr = stderr.as_bytes().to_vec();
        self
    }

    /// Running for `duration`.
    pub fn taking(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }
}
