//! Lines for the terminal that never stop the program. std's `println!` and `eprintln!`
//! panic when the write fails (stdout piped into `head`, stderr on a full device), which
//! would end a run in the middle of a cell; here such a line is lost, never a run or its
//! records. What a command exists to print (an export, a comparison) is written with a
//! checked write instead, so that its failure is the command's.

use std::io::Write;

/// Writes one line to stdout; a failure loses the line.
pub fn out(line: std::fmt::Arguments<'_>) {
    let mut w = std::io::stdout().lock();
    let _ = w
        .write_fmt(line)
        .and_then(|()| w.write_all(b"\n"))
        .and_then(|()| w.flush());
}

/// Writes one line to stderr; a failure loses the line.
pub fn err(line: std::fmt::Arguments<'_>) {
    let mut w = std::io::stderr().lock();
    let _ = w.write_fmt(line).and_then(|()| w.write_all(b"\n"));
}

/// `println!` that cannot panic: see [`out`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::console::out(format_args!($($arg)*)) };
}

/// `eprintln!` that cannot panic: see [`err`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::console::err(format_args!($($arg)*)) };
}
