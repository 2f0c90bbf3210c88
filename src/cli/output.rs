//! Where a command's long output goes, as git does it: on a terminal,
//! through `$PAGER` (else `less` with `LESS=FRX`: it quits when the output
//! fits, keeps colour and leaves the screen as it was) and in colour;
//! piped or redirected, plain and straight to stdout.
//!
//! Invariants: colour only on a terminal, never with `NO_COLOR` set or
//! `TERM=dumb`; a pager that cannot start is no error (the output goes to
//! stdout); a reader that goes away (`| head`, `q` in less) ends the
//! output quietly.
//!
//! Locks: none.

use std::io::{IsTerminal, Write};
use std::process::{Child, Command, Stdio};

/// ANSI styles, as git uses them.
#[derive(Clone, Copy)]
pub enum Style {
    Yellow,
    Green,
    Red,
    Cyan,
    Dim,
}

impl Style {
    fn code(self) -> &'static str {
        match self {
            Style::Yellow => "33",
            Style::Green => "32",
            Style::Red => "31",
            Style::Cyan => "36",
            Style::Dim => "2",
        }
    }
}

/// The output of one command.
pub struct Out {
    colour: bool,
    pager: Option<Child>,
    stdout: std::io::Stdout,
}

impl Out {
    /// Pages and colours when stdout is a terminal (and `page` allows it).
    pub fn open(page: bool) -> Out {
        let tty = std::io::stdout().is_terminal();
        let colour = tty
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            && std::env::var("TERM").map_or(true, |t| t != "dumb");
        let pager = if tty && page { start_pager() } else { None };
        Out {
            colour,
            pager,
            stdout: std::io::stdout(),
        }
    }

    /// `text` in `style` when colouring.
    pub fn paint(&self, style: Style, text: &str) -> String {
        if self.colour {
            format!("\x1b[{}m{text}\x1b[m", style.code())
        } else {
            text.to_string()
        }
    }

    /// Writes one line; `false` once the reader has gone away.
    pub fn line(&mut self, text: &str) -> bool {
        let res = match self.pager.as_mut().and_then(|p| p.stdin.as_mut()) {
            Some(pipe) => writeln!(pipe, "{text}"),
            None => writeln!(self.stdout.lock(), "{text}"),
        };
        res.is_ok()
    }

    /// Raw bytes (a JSON line already ending in a newline).
    pub fn bytes(&mut self, b: &[u8]) -> bool {
        let res = match self.pager.as_mut().and_then(|p| p.stdin.as_mut()) {
            Some(pipe) => pipe.write_all(b),
            None => self.stdout.lock().write_all(b),
        };
        res.is_ok()
    }
}

impl Drop for Out {
    /// Closes the pager's input and waits for the user to leave it.
    fn drop(&mut self) {
        if let Some(mut p) = self.pager.take() {
            drop(p.stdin.take());
            let _ = p.wait();
        }
        let _ = self.stdout.flush();
    }
}

/// `$PAGER` (none when empty or `cat`), else `less`, with `LESS=FRX`
/// unless `LESS` is set.
fn start_pager() -> Option<Child> {
    let pager = match std::env::var("PAGER") {
        Ok(p) if p.trim().is_empty() || p.trim() == "cat" => return None,
        Ok(p) => p,
        Err(_) => "less".to_string(),
    };
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("exec {pager}"))
        .stdin(Stdio::piped());
    if std::env::var_os("LESS").is_none() {
        cmd.env("LESS", "FRX");
    }
    cmd.spawn().ok()
}
