//! SQL as text: the statements the model understands, parsed from PostgreSQL's syntax into [`Stmt`].
//!
//! A lock written against PostgreSQL is a handful of SQL strings; this lets a user keep them as
//! strings. A [`Schema`] knows the tables its `CREATE TABLE` statements declared — each has exactly one
//! primary key column of a text type, the key the model's rows are found by — so that every other
//! statement can be checked against it: a column that does not exist, or a `WHERE` that does not name
//! the row by its key, is an error here, with the column of the statement where it went wrong, before
//! anything runs. What the model cannot do is an error too, never a different statement.
//!
//! [`Schema::parse`] gives the model's statement. [`Schema::prepare`] takes `$1`, `$2`, … placeholders
//! and [`Prepared::bind`] their values, giving [`Stmt::Text`]: the model runs the statement it stands
//! for, and real mode sends the text as written, with its values — the user's own columns and types
//! reach the real server (`locksim_locks::sql::SqlApi::query` does both steps).
//!
//! The subset (keywords in any case; one statement, an optional `;` at the end):
//! - `BEGIN` (`START TRANSACTION`), `COMMIT` (`END`), `ROLLBACK` (`ABORT`)
//! - `CREATE TABLE [IF NOT EXISTS] t (c type [PRIMARY KEY] [NOT NULL], …[, [CONSTRAINT n] PRIMARY KEY (c)])`
//!   — one primary key column, of type `text`, `varchar[(n)]` or `character varying[(n)]`; other types
//!   `bigint`, `integer`, `smallint` (`int8`, `int`, `int4`, `int2`), `timestamp[(p)] [with[out] time
//!   zone]`, `timestamptz`; no defaults or other constraints — and `CREATE SEQUENCE [IF NOT EXISTS] s`
//! - `SELECT * | c, … FROM t WHERE k = 'key' [FOR UPDATE]` (every column comes back, as with `*`)
//! - `INSERT INTO t [(k, c, …)] VALUES ('key', expr, …) [ON CONFLICT [(k)] DO NOTHING]` (no column
//!   list: the table's columns in order)
//! - `UPDATE t SET c = expr, … WHERE k = 'key' [AND c op expr …]`, `DELETE FROM t WHERE k = 'key' [AND …]`
//! - `SELECT nextval('s')`, `SELECT pg_advisory_lock(n)`, `pg_try_advisory_lock(n)`, `pg_advisory_unlock(n)`
//! - `SET lock_timeout = …`, `SET idle_in_transaction_session_timeout = …` (`0`, milliseconds, or a
//!   string with a unit: `'500ms'`, `'5s'`, `'1min'`)
//!
//! `k` is the table's primary key column, whatever its name; a column may be qualified by its table
//! (`shedlock.lock_until`). `expr` is a literal (`'text'`, an integer, `NULL`), `now()` or `now() ±
//! interval '…'` (the model keeps times as milliseconds), or a column `±` an integer; `op` is `=`,
//! `<>`, `!=`, `<`, `<=`, `>`, `>=`. A `$n` may stand for the key, an `expr` of a text or integer
//! column, or an advisory lock's key.
//!
//! The other way, [`write()`] writes a [`Stmt`] as the SQL a real PostgreSQL runs — for real mode's
//! connections and for conformance — in a [`Style`] that says how to write a time.

use super::{Cond, Expr, Op, SqlText, Stmt, ToValue, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// A statement the model cannot run: where in it, and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlTextError {
    pub statement: String,
    /// 1-based character column of the statement where it went wrong.
    pub column: usize,
    pub message: String,
}

impl fmt::Display for SqlTextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}, column {}: {}", self.statement, self.column, self.message)
    }
}

impl std::error::Error for SqlTextError {}

/// The tables statements may name: each `CREATE TABLE` parsed adds one.
#[derive(Debug, Clone, Default)]
pub struct Schema {
    tables: BTreeMap<String, Table>,
}

#[derive(Debug, Clone)]
struct Table {
    name: String,
    /// The primary key column (of a text type): the key the model finds rows by.
    key: String,
    /// Every column, the key among them, in declared order.
    columns: Vec<String>,
    /// Each column's type.
    types: BTreeMap<String, ColumnType>,
}

/// A column's type, as far as the model tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnType {
    /// `text`, `varchar[(n)]`, `character varying[(n)]`.
    Text,
    /// `smallint`, `integer`, `bigint` (`int2`, `int`, `int4`, `int8`).
    Int,
    /// `timestamp[(p)] [with[out] time zone]`, `timestamptz`: the model keeps times as milliseconds.
    Time,
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ColumnType::Text => "a text type",
            ColumnType::Int => "an integer type",
            ColumnType::Time => "a timestamp",
        })
    }
}

impl Schema {
    pub fn new() -> Schema {
        Schema::default()
    }

    /// Parse one statement into the model's. A `CREATE TABLE` also declares its table here, for the
    /// statements after it. A `$1` placeholder is an error here: [`Schema::prepare`] takes them.
    pub fn parse(&mut self, sql: &str) -> Result<Stmt, SqlTextError> {
        let (stmt, declared) = self.parse_in(sql, &mut Binding::None)?;
        self.declare(&stmt, declared);
        Ok(stmt)
    }

    /// Prepare one statement with `$1`, `$2`, … placeholders where values go (a key, a value, an
    /// advisory lock's key), checked as [`Schema::parse`] checks: run it with [`Prepared::bind`] and
    /// its values, or `SqlApi::query(&prepared, &[&value, …])` — tokio-postgres's `prepare` and
    /// `query(&statement, &[&p])`. A `CREATE TABLE` also declares its table here.
    pub fn prepare(&mut self, sql: &str) -> Result<Prepared, SqlTextError> {
        let mut binding = Binding::Prepare(0);
        let (stmt, declared) = self.parse_in(sql, &mut binding)?;
        self.declare(&stmt, declared);
        let Binding::Prepare(params) = binding else { unreachable!("still preparing") };
        Ok(Prepared { sql: sql.to_string(), params, schema: self.clone() })
    }

    fn parse_in(&self, sql: &str, binding: &mut Binding) -> Result<(Stmt, Option<Table>), SqlTextError> {
        let tokens = lex(sql)?;
        let mut p = Parser { sql, tokens, at: 0, declared: None, binding };
        let stmt = p.statement(self)?;
        p.eat_symbol(";");
        if let Some(t) = p.peek() {
            return Err(p.error_at(t, format!("expected the end of the statement, found {}", t.shown())));
        }
        Ok((stmt, p.declared))
    }

    fn declare(&mut self, stmt: &Stmt, declared: Option<Table>) {
        if let (Stmt::CreateTable { table, .. }, Some(declared)) = (stmt, declared) {
            self.tables.entry(table.clone()).or_insert(declared);
        }
    }
}

/// A statement of SQL text with `$1`, `$2`, … placeholders, checked against its [`Schema`]
/// ([`Schema::prepare`]); [`Prepared::bind`] gives it values.
#[derive(Debug, Clone)]
pub struct Prepared {
    sql: String,
    /// How many values it takes: its highest `$n`.
    params: usize,
    /// The tables as declared when it was prepared.
    schema: Schema,
}

impl Prepared {
    /// The SQL as written.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// How many values [`Prepared::bind`] takes.
    pub fn params(&self) -> usize {
        self.params
    }

    /// The statement with `params` as `$1`, `$2`, …: a [`Stmt::Text`], which the model runs as the
    /// statement the text stands for and a real server runs as written, with these values. An error
    /// (at the placeholder's column) if there are more or fewer values than placeholders, or a value
    /// of the wrong kind for its place: a key is text, an integer column takes integers, a text
    /// column text; a timestamp column takes none (the model's times are `now() ± interval '…'`).
    pub fn bind(&self, params: &[&dyn ToValue]) -> Result<Stmt, SqlTextError> {
        let values: Vec<Value> = params.iter().map(|p| p.to_value()).collect();
        if values.len() != self.params {
            let m = format!("expected {} value(s), for $1 to ${}, found {}", self.params, self.params, values.len());
            return Err(error(&self.sql, 0, m));
        }
        let (stmt, _) = self.schema.parse_in(&self.sql, &mut Binding::Bind(&values))?;
        Ok(Stmt::Text(Box::new(SqlText { sql: self.sql.clone(), params: values, stmt })))
    }
}

/// What a `$n` stands for while parsing.
enum Binding<'v> {
    /// [`Schema::parse`]: there are none.
    None,
    /// [`Schema::prepare`]: values still to come; the highest `$n` so far.
    Prepare(usize),
    /// [`Prepared::bind`]: these values.
    Bind(&'v [Value]),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Int(i64),
    Symbol(&'static str),
    /// `$n`, a bind parameter.
    Param(usize),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// Byte offset in the statement.
    at: usize,
}

impl Token {
    fn shown(&self) -> String {
        match &self.tok {
            Tok::Word(w) => format!("`{w}`"),
            Tok::Str(s) => format!("'{s}'"),
            Tok::Int(n) => n.to_string(),
            Tok::Symbol(s) => format!("`{s}`"),
            Tok::Param(n) => format!("${n}"),
        }
    }
}

const SYMBOLS: [&str; 14] = ["<>", "!=", "<=", ">=", "(", ")", ",", "*", "=", "<", ">", "+", "-", "."];

fn lex(sql: &str) -> Result<Vec<Token>, SqlTextError> {
    let mut tokens = Vec::new();
    let mut rest = sql.char_indices().peekable();
    while let Some(&(at, c)) = rest.peek() {
        if c.is_whitespace() {
            rest.next();
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut word = String::new();
            while let Some(&(_, c)) = rest.peek().filter(|(_, c)| c.is_ascii_alphanumeric() || *c == '_') {
                word.push(c.to_ascii_lowercase());
                rest.next();
            }
            tokens.push(Token { tok: Tok::Word(word), at });
        } else if c.is_ascii_digit() {
            let mut digits = String::new();
            while let Some(&(_, c)) = rest.peek().filter(|(_, c)| c.is_ascii_digit()) {
                digits.push(c);
                rest.next();
            }
            let n = digits.parse().map_err(|_| error(sql, at, "an integer out of range (64-bit)"))?;
            tokens.push(Token { tok: Tok::Int(n), at });
        } else if c == '$' {
            rest.next();
            let mut digits = String::new();
            while let Some(&(_, c)) = rest.peek().filter(|(_, c)| c.is_ascii_digit()) {
                digits.push(c);
                rest.next();
            }
            match digits.parse::<usize>() {
                Ok(n) if n > 0 => tokens.push(Token { tok: Tok::Param(n), at }),
                _ => return Err(error(sql, at, "expected a bind parameter, `$` and its number from 1 (`$1`)")),
            }
        } else if c == '\'' {
            rest.next();
            let mut s = String::new();
            loop {
                match rest.next() {
                    Some((_, '\'')) if rest.peek().is_some_and(|(_, c)| *c == '\'') => {
                        rest.next();
                        s.push('\'');
                    }
                    Some((_, '\'')) => break,
                    Some((_, c)) => s.push(c),
                    None => return Err(error(sql, at, "a string that is never closed (expected a closing `'`)")),
                }
            }
            tokens.push(Token { tok: Tok::Str(s), at });
        } else if c == ';' && sql[at + 1..].trim().is_empty() {
            tokens.push(Token { tok: Tok::Symbol(";"), at });
            break;
        } else if let Some(sym) = SYMBOLS.iter().find(|s| sql[at..].starts_with(**s)) {
            for _ in 0..sym.len() {
                rest.next();
            }
            tokens.push(Token { tok: Tok::Symbol(sym), at });
        } else {
            let what = if c == ';' {
                "one statement at a time (a `;` only at the end)".to_string()
            } else {
                format!("`{c}`, which the model's SQL does not use")
            };
            return Err(error(sql, at, format!("unexpected {what}")));
        }
    }
    Ok(tokens)
}

fn error(sql: &str, at: usize, message: impl Into<String>) -> SqlTextError {
    let column = sql[..at.min(sql.len())].chars().count() + 1;
    SqlTextError { statement: sql.to_string(), column, message: message.into() }
}

struct Parser<'a, 'b, 'v> {
    sql: &'a str,
    tokens: Vec<Token>,
    at: usize,
    /// The table a `CREATE TABLE` declares, once parsed.
    declared: Option<Table>,
    binding: &'b mut Binding<'v>,
}

impl Parser<'_, '_, '_> {
    /// Where the next token starts (the end when there is none).
    fn offset(&self) -> usize {
        self.peek().map_or(self.sql.trim_end().trim_end_matches(';').len(), |t| t.at)
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at).filter(|t| t.tok != Tok::Symbol(";"))
    }

    fn error_at(&self, t: &Token, message: String) -> SqlTextError {
        error(self.sql, t.at, message)
    }

    /// An error at the next token (or the end): `expected …, found …`.
    fn expected(&self, what: &str) -> SqlTextError {
        match self.peek() {
            Some(t) => self.error_at(t, format!("expected {what}, found {}", t.shown())),
            None => error(self.sql, self.offset(), format!("expected {what}, found the end")),
        }
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token { tok: Tok::Word(w), .. }) if w == word)
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let yes = self.is_word(word);
        self.at += usize::from(yes);
        yes
    }

    fn word(&mut self, word: &str) -> Result<(), SqlTextError> {
        if self.eat_word(word) {
            Ok(())
        } else {
            Err(self.expected(&format!("`{}`", word.to_uppercase())))
        }
    }

    fn is_symbol(&self, symbol: &str) -> bool {
        matches!(self.tokens.get(self.at), Some(Token { tok: Tok::Symbol(s), .. }) if *s == symbol)
    }

    fn eat_symbol(&mut self, symbol: &str) -> bool {
        let yes = matches!(self.tokens.get(self.at), Some(Token { tok: Tok::Symbol(s), .. }) if *s == symbol);
        self.at += usize::from(yes);
        yes
    }

    fn symbol(&mut self, symbol: &str) -> Result<(), SqlTextError> {
        if self.eat_symbol(symbol) {
            Ok(())
        } else {
            Err(self.expected(&format!("`{symbol}`")))
        }
    }

    fn name(&mut self, what: &str) -> Result<String, SqlTextError> {
        match self.peek().map(|t| t.tok.clone()) {
            Some(Tok::Word(w)) => {
                self.at += 1;
                Ok(w)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, SqlTextError> {
        match self.peek().map(|t| t.tok.clone()) {
            Some(Tok::Str(s)) => {
                self.at += 1;
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    /// The value of the bind parameter `t` (`$n`): `None` while preparing.
    fn param(&mut self, t: &Token, n: usize) -> Result<Option<Value>, SqlTextError> {
        match &mut *self.binding {
            Binding::None => Err(self.error_at(
                t,
                format!(
                    "a bind parameter (${n}) in SQL parsed without values: prepare it (Schema::prepare) and bind them"
                ),
            )),
            Binding::Prepare(most) => {
                *most = (*most).max(n);
                Ok(None)
            }
            Binding::Bind(values) => {
                let (value, given) = (values.get(n - 1).cloned(), values.len());
                value
                    .map(Some)
                    .ok_or_else(|| error(self.sql, t.at, format!("expected a value for ${n}, found {given}")))
            }
        }
    }

    /// The next token if it is a bind parameter (taken), with its number.
    fn eat_param(&mut self) -> Option<(Token, usize)> {
        let t = self.peek().cloned()?;
        let Tok::Param(n) = t.tok else { return None };
        self.at += 1;
        Some((t, n))
    }

    /// A row's key: a text literal or a bind parameter with a text value.
    fn key(&mut self, what: &str) -> Result<String, SqlTextError> {
        let Some((t, n)) = self.eat_param() else { return self.string(what) };
        match self.param(&t, n)? {
            None => Ok(String::new()),
            Some(Value::Text(key)) => Ok(key),
            Some(other) => {
                let m = format!("expected a text value for ${n} (the key, where the text has {what}), found {other:?}");
                Err(self.error_at(&t, m))
            }
        }
    }

    fn int(&mut self, what: &str) -> Result<i64, SqlTextError> {
        if let Some((t, n)) = self.eat_param() {
            return match self.param(&t, n)? {
                None => Ok(0),
                Some(Value::Int(i)) => Ok(i),
                Some(other) => Err(self.error_at(&t, format!("expected {what} for ${n}, found {other:?}"))),
            };
        }
        let negative = self.eat_symbol("-");
        match self.peek().map(|t| t.tok.clone()) {
            Some(Tok::Int(n)) => {
                self.at += 1;
                Ok(if negative { -n } else { n })
            }
            _ => Err(self.expected(what)),
        }
    }

    fn statement(&mut self, schema: &Schema) -> Result<Stmt, SqlTextError> {
        let first = self.peek().cloned().ok_or_else(|| self.expected("a statement"))?;
        let Tok::Word(verb) = &first.tok else { return Err(self.expected("a statement")) };
        self.at += 1;
        match verb.as_str() {
            "begin" => Ok(Stmt::Begin),
            "start" => self.word("transaction").map(|()| Stmt::Begin),
            "commit" | "end" => Ok(Stmt::Commit),
            "rollback" | "abort" => Ok(Stmt::Rollback),
            "create" => self.create(),
            "select" => self.select(schema),
            "insert" => self.insert(schema),
            "update" => self.update(schema),
            "delete" => self.delete(schema),
            "set" => self.set(),
            _ => Err(self.error_at(
                &first,
                format!(
                    "expected BEGIN, COMMIT, ROLLBACK, CREATE, SELECT, INSERT, UPDATE, DELETE or SET, found {} (the \
                     model's SQL is listed in locksim_sim::backend::sql::text)",
                    first.shown()
                ),
            )),
        }
    }

    fn if_not_exists(&mut self) -> Result<bool, SqlTextError> {
        if self.eat_word("if") {
            self.word("not")?;
            self.word("exists")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn create(&mut self) -> Result<Stmt, SqlTextError> {
        if self.eat_word("sequence") {
            let if_not_exists = self.if_not_exists()?;
            let sequence = self.name("a sequence name")?;
            return Ok(Stmt::CreateSequence { sequence, if_not_exists });
        }
        self.word("table").map_err(|_| self.expected("`TABLE` or `SEQUENCE`"))?;
        let if_not_exists = self.if_not_exists()?;
        let name = self.name("a table name")?;
        self.symbol("(")?;
        let mut table = Table { name: name.clone(), key: String::new(), columns: Vec::new(), types: BTreeMap::new() };
        // The key column and where it was named.
        let mut key: Option<(String, usize)> = None;
        loop {
            let start = self.offset();
            let named = match self.is_word("primary") || self.is_word("constraint") {
                true => self.key_constraint()?,
                false => self.column_definition(&mut table)?,
            };
            if let Some(column) = named {
                if key.replace((column, start)).is_some() {
                    return Err(error(self.sql, start, "expected one PRIMARY KEY, found a second"));
                }
            }
            if !self.eat_symbol(",") {
                break;
            }
        }
        let Some((key, at)) = key else {
            return Err(self.expected("a `text PRIMARY KEY` column before `)` (the model finds rows by one text key)"));
        };
        self.symbol(")")?;
        match table.types.get(&key) {
            Some(ColumnType::Text) => {}
            Some(_) => {
                let m = format!("the model keys rows by text; make {key} `text PRIMARY KEY` (or varchar)");
                return Err(error(self.sql, at, m));
            }
            None => {
                let m = format!("the key column {key} is not declared; expected one of {}", table.columns.join(", "));
                return Err(error(self.sql, at, m));
            }
        }
        table.key = key;
        self.declared = Some(table);
        Ok(Stmt::CreateTable { table: name, if_not_exists })
    }

    /// `[CONSTRAINT name] PRIMARY KEY (column)`: the key column.
    fn key_constraint(&mut self) -> Result<Option<String>, SqlTextError> {
        if self.eat_word("constraint") {
            self.name("the constraint's name")?;
        }
        self.word("primary")?;
        self.word("key")?;
        self.symbol("(")?;
        let column = self.name("the key column")?;
        if self.is_symbol(",") {
            return Err(self.expected("`)` after the key column (the model finds rows by one text key)"));
        }
        self.symbol(")")?;
        Ok(Some(column))
    }

    /// `column type [PRIMARY KEY | NOT NULL | NULL]…`: declared in `table`; its name if it is the key.
    fn column_definition(&mut self, table: &mut Table) -> Result<Option<String>, SqlTextError> {
        let start = self.offset();
        let column = self.name("a column name")?;
        let ty = self.column_type()?;
        let mut key = false;
        loop {
            if self.eat_word("primary") {
                self.word("key")?;
                if std::mem::replace(&mut key, true) {
                    return Err(self.expected("one PRIMARY KEY"));
                }
            } else if self.eat_word("not") {
                self.word("null")?;
            } else if !self.eat_word("null") {
                break;
            }
        }
        if let Some(t) = self.peek().filter(|t| matches!(t.tok, Tok::Word(_))) {
            let m = format!(
                "expected PRIMARY KEY, NOT NULL, `,` or `)`, found {} (the model keeps no defaults or other constraints)",
                t.shown()
            );
            return Err(self.error_at(t, m));
        }
        if table.columns.contains(&column) {
            return Err(error(self.sql, start, format!("column {column} is declared twice")));
        }
        table.columns.push(column.clone());
        table.types.insert(column.clone(), ty);
        Ok(key.then_some(column))
    }

    /// A column's type, with its length or precision: `varchar(64)`, `timestamp(3) with time zone`, ….
    fn column_type(&mut self) -> Result<ColumnType, SqlTextError> {
        const TYPES: &str = "the column's type (text, varchar(n), bigint, integer, smallint, timestamp, timestamptz)";
        let at = self.offset();
        let ty = match self.name(TYPES)?.as_str() {
            "text" | "varchar" => ColumnType::Text,
            "character" => {
                self.word("varying")?;
                ColumnType::Text
            }
            "bigint" | "int8" | "integer" | "int" | "int4" | "smallint" | "int2" => ColumnType::Int,
            "timestamp" | "timestamptz" => ColumnType::Time,
            other => return Err(error(self.sql, at, format!("expected {TYPES}, found `{other}`"))),
        };
        if ty != ColumnType::Int && self.eat_symbol("(") {
            self.int("a length or precision")?;
            self.symbol(")")?;
        }
        if ty == ColumnType::Time && (self.is_word("with") || self.is_word("without")) {
            self.at += 1;
            self.word("time")?;
            self.word("zone")?;
        }
        Ok(ty)
    }

    fn table<'s>(&mut self, schema: &'s Schema) -> Result<(String, &'s Table), SqlTextError> {
        let at = self.offset();
        let name = self.name("a table name")?;
        match schema.tables.get(&name) {
            Some(t) => Ok((name, t)),
            None => {
                Err(error(self.sql, at, format!("table {name} is not in the schema: parse its CREATE TABLE first")))
            }
        }
    }

    fn column(&mut self, table: &Table, what: &str) -> Result<String, SqlTextError> {
        let at = self.offset();
        let mut column = self.name(what)?;
        if self.eat_symbol(".") {
            // Qualified by its table: `shedlock.lock_until`.
            if column != table.name {
                return Err(error(self.sql, at, format!("expected a column of {}, found {column}.…", table.name)));
            }
            column = self.name(what)?;
        }
        if table.columns.contains(&column) {
            Ok(column)
        } else {
            Err(error(
                self.sql,
                at,
                format!("column {column} does not exist; expected one of {}", table.columns.join(", ")),
            ))
        }
    }

    /// `WHERE key = 'k' [AND column op expr …]`: the key, and the other conditions.
    fn where_key(&mut self, table: &Table) -> Result<(String, Vec<Cond>), SqlTextError> {
        self.word("where")?;
        let at = self.offset();
        let column = self.column(table, "the key column")?;
        if column != table.key {
            let m = format!("expected the row's key first (`{} = '…'`): the model finds rows by their key", table.key);
            return Err(error(self.sql, at, m));
        }
        self.symbol("=")?;
        let key = self.key("the key, a text literal ('…')")?;
        let mut cond = Vec::new();
        while self.eat_word("and") {
            let column = self.column(table, "a column")?;
            let op = self.op()?;
            let rhs = self.expr(table, &column)?;
            cond.push(Cond { column, op, rhs });
        }
        Ok((key, cond))
    }

    fn op(&mut self) -> Result<Op, SqlTextError> {
        let ops = [
            ("=", Op::Eq),
            ("<>", Op::Ne),
            ("!=", Op::Ne),
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("<", Op::Lt),
            (">", Op::Gt),
        ];
        for (symbol, op) in ops {
            if self.eat_symbol(symbol) {
                return Ok(op);
            }
        }
        Err(self.expected("a comparison (=, <>, <, <=, >, >=)"))
    }

    /// A value for `column`.
    fn expr(&mut self, table: &Table, column: &str) -> Result<Expr, SqlTextError> {
        if let Some((t, n)) = self.eat_param() {
            let Some(value) = self.param(&t, n)? else { return Ok(Expr::Value(Value::Null)) };
            let ty = table.types.get(column).copied();
            return match (ty, &value) {
                (_, Value::Null)
                | (Some(ColumnType::Text), Value::Text(_))
                | (Some(ColumnType::Int), Value::Int(_)) => Ok(Expr::Value(value)),
                (Some(ColumnType::Time), _) => Err(self.error_at(
                    &t,
                    format!(
                        "column {column} is a timestamp: the model's times are now() ± interval '…', not a value \
                         bound to ${n}"
                    ),
                )),
                (ty, _) => {
                    let ty = ty.map_or("unknown".to_string(), |ty| ty.to_string());
                    Err(self.error_at(
                        &t,
                        format!("column {column} is {ty}: expected a value of it for ${n}, found {value:?}"),
                    ))
                }
            };
        }
        match self.peek().map(|t| t.tok.clone()) {
            Some(Tok::Str(s)) => {
                self.at += 1;
                Ok(Expr::Value(Value::Text(s)))
            }
            Some(Tok::Int(_)) | Some(Tok::Symbol("-")) => Ok(Expr::Value(Value::Int(self.int("an integer")?))),
            Some(Tok::Word(w)) if w == "null" => {
                self.at += 1;
                Ok(Expr::Value(Value::Null))
            }
            Some(Tok::Word(w)) if w == "now" => {
                self.at += 1;
                self.symbol("(")?;
                self.symbol(")")?;
                let sign = if self.eat_symbol("+") {
                    1
                } else if self.eat_symbol("-") {
                    -1
                } else {
                    return Ok(Expr::NowPlus(0));
                };
                self.word("interval")?;
                let at = self.offset();
                let text = self.string("an interval ('30 seconds', '500ms', …)")?;
                let d = duration(&text).ok_or_else(|| {
                    error(self.sql, at, format!("expected an interval like '30 seconds' or '500ms', found '{text}'"))
                })?;
                Ok(Expr::NowPlus(sign * d.as_millis() as i64))
            }
            Some(Tok::Word(_)) => {
                let column = self.column(table, "a column")?;
                let sign = if self.eat_symbol("+") {
                    1
                } else if self.eat_symbol("-") {
                    -1
                } else {
                    return Err(self.expected(
                        "`+` or `-` and an integer after the column (a bare column is not a value the model computes)",
                    ));
                };
                Ok(Expr::ColumnPlus(column, sign * self.int("an integer")?))
            }
            _ => {
                Err(self.expected("a value: 'text', an integer, NULL, now() [± interval '…'] or a column ± an integer"))
            }
        }
    }

    fn select(&mut self, schema: &Schema) -> Result<Stmt, SqlTextError> {
        if let Some(Tok::Word(f)) = self.peek().map(|t| t.tok.clone()) {
            let calls = [
                "nextval",
                "pg_advisory_lock",
                "pg_try_advisory_lock",
                "pg_advisory_unlock",
                "pg_advisory_xact_lock",
                "pg_try_advisory_xact_lock",
            ];
            if calls.contains(&f.as_str()) && self.tokens.get(self.at + 1).is_some_and(|t| t.tok == Tok::Symbol("(")) {
                self.at += 2;
                let stmt = match f.as_str() {
                    "nextval" => Stmt::NextVal { sequence: self.string("the sequence's name as a string ('s')")? },
                    "pg_advisory_lock" => Stmt::AdvisoryLock(self.int("a 64-bit key")?),
                    "pg_try_advisory_lock" => Stmt::TryAdvisoryLock(self.int("a 64-bit key")?),
                    "pg_advisory_xact_lock" => Stmt::AdvisoryXactLock(self.int("a 64-bit key")?),
                    "pg_try_advisory_xact_lock" => Stmt::TryAdvisoryXactLock(self.int("a 64-bit key")?),
                    _ => Stmt::AdvisoryUnlock(self.int("a 64-bit key")?),
                };
                self.symbol(")")?;
                return Ok(stmt);
            }
        }
        // The columns are checked once the table is known.
        let list_at = self.at;
        if !self.eat_symbol("*") {
            loop {
                self.name("`*`, a column, nextval('…') or a pg_advisory_* call")?;
                if self.eat_symbol(".") {
                    self.name("a column")?;
                }
                if !self.eat_symbol(",") {
                    break;
                }
            }
        }
        let list_end = self.at;
        self.word("from")?;
        let (table, spec) = self.table(schema)?;
        let after = self.at;
        self.at = list_at;
        while self.at < list_end {
            if !self.eat_symbol("*") && !self.eat_symbol(",") {
                self.column(spec, "a column")?;
            }
        }
        self.at = after;
        let (key, cond) = self.where_key(spec)?;
        if let Some(c) = cond.first() {
            let m = format!(
                "a SELECT finds its row by the key alone; the condition on {} is more than the model reads",
                c.column
            );
            return Err(error(self.sql, self.tokens[self.at.saturating_sub(1)].at, m));
        }
        let for_update = self.eat_word("for");
        if for_update {
            self.word("update")?;
        }
        Ok(Stmt::Select { table, key, for_update })
    }

    fn insert(&mut self, schema: &Schema) -> Result<Stmt, SqlTextError> {
        self.word("into")?;
        let (table, spec) = self.table(schema)?;
        let mut columns = Vec::new();
        if self.eat_symbol("(") {
            loop {
                columns.push(self.column(spec, "a column")?);
                if !self.eat_symbol(",") {
                    break;
                }
            }
            self.symbol(")")?;
        } else {
            columns = spec.columns.clone();
        }
        self.word("values")?;
        self.symbol("(")?;
        let mut key = None;
        let mut row = Vec::new();
        for (i, column) in columns.iter().enumerate() {
            if i > 0 {
                self.symbol(",")?;
            }
            if *column == spec.key {
                key = Some(self.key(&format!("the key ({column}), a text literal ('…')"))?);
            } else {
                row.push((column.clone(), self.expr(spec, column)?));
            }
        }
        if self.eat_symbol(",") {
            return Err(
                self.expected(&format!("`)` ending the values: the column list names {} column(s)", columns.len()))
            );
        }
        self.symbol(")")?;
        let key = key.ok_or_else(|| self.expected(&format!("a value for the key column {}", spec.key)))?;
        if !self.eat_word("on") {
            return Ok(Stmt::Insert { table, key, row });
        }
        self.word("conflict")?;
        if self.eat_symbol("(") {
            let at = self.offset();
            let column = self.column(spec, "the key column")?;
            if column != spec.key {
                let m = format!("expected the key column {}: the model's one unique constraint is its key", spec.key);
                return Err(error(self.sql, at, m));
            }
            self.symbol(")")?;
        }
        self.word("do")?;
        if !self.eat_word("nothing") {
            return Err(self.expected("`NOTHING` (the model runs ON CONFLICT … DO NOTHING, not DO UPDATE)"));
        }
        Ok(Stmt::InsertOnConflictDoNothing { table, key, row })
    }

    fn update(&mut self, schema: &Schema) -> Result<Stmt, SqlTextError> {
        let (table, spec) = self.table(schema)?;
        self.word("set")?;
        let mut set = Vec::new();
        loop {
            let at = self.offset();
            let column = self.column(spec, "a column")?;
            if column == spec.key {
                return Err(error(self.sql, at, "the model does not change a row's key"));
            }
            self.symbol("=")?;
            let value = self.expr(spec, &column)?;
            set.push((column, value));
            if !self.eat_symbol(",") {
                break;
            }
        }
        let (key, cond) = self.where_key(spec)?;
        Ok(Stmt::Update { table, key, set, cond })
    }

    fn delete(&mut self, schema: &Schema) -> Result<Stmt, SqlTextError> {
        self.word("from")?;
        let (table, spec) = self.table(schema)?;
        let (key, cond) = self.where_key(spec)?;
        Ok(Stmt::Delete { table, key, cond })
    }

    fn set(&mut self) -> Result<Stmt, SqlTextError> {
        let at = self.offset();
        let setting = self.name("lock_timeout or idle_in_transaction_session_timeout")?;
        if !self.eat_symbol("=") {
            self.word("to")?;
        }
        let d = match self.peek().map(|t| t.tok.clone()) {
            Some(Tok::Int(ms)) if ms >= 0 => {
                self.at += 1;
                Some(Duration::from_millis(ms as u64))
            }
            Some(Tok::Str(s)) => {
                self.at += 1;
                duration(&s)
            }
            _ => None,
        };
        let d = d.ok_or_else(|| self.expected("0, milliseconds, or a string with a unit ('500ms', '5s', '1min')"))?;
        match setting.as_str() {
            "lock_timeout" => Ok(Stmt::SetLockTimeout(d)),
            "idle_in_transaction_session_timeout" => Ok(Stmt::SetIdleInTransactionSessionTimeout(d)),
            other => Err(error(
                self.sql,
                at,
                format!("the model has the settings lock_timeout and idle_in_transaction_session_timeout, not {other}"),
            )),
        }
    }
}

/// PostgreSQL's time units in a setting or interval: `500ms`, `5s`, `5 seconds`, `1min`, `2 minutes`,
/// `1h`, or a bare number of milliseconds.
fn duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let n: u64 = text[..split].parse().ok()?;
    let ms = match text[split..].trim() {
        "" | "ms" | "millisecond" | "milliseconds" => 1,
        "s" | "sec" | "second" | "seconds" => 1_000,
        "min" | "minute" | "minutes" => 60_000,
        "h" | "hour" | "hours" => 3_600_000,
        _ => return None,
    };
    Some(Duration::from_millis(n.checked_mul(ms)?))
}

/// How [`write()`] writes what can be asked of PostgreSQL in more than one way.
#[derive(Debug, Clone, Copy)]
pub struct Style<'a> {
    /// What a `SELECT` of a row lists: `*`, or its columns (`n, owner, until`) in a fixed order.
    pub select: &'a str,
    /// How `now()` is written where the model keeps it as milliseconds ([`Expr::NowPlus`]).
    pub now: NowAs,
}

/// How `now() + ms` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NowAs {
    /// `now() + interval '… ms'`: as people write it, and as [`Schema::parse`] reads it back.
    Interval,
    /// Milliseconds since an origin in epoch milliseconds, as a `bigint` (0: epoch milliseconds, as the
    /// built-in recipes' real tables keep their times).
    MillisSince(i64),
}

impl Style<'_> {
    /// Every column, times in epoch milliseconds: the built-in recipes' statements on a real server.
    pub const REAL: Style<'static> = Style { select: "*", now: NowAs::MillisSince(0) };
}

/// The SQL text a statement stands for (tables keyed by the text column `k`), in `style`; SQL text
/// ([`Stmt::Text`]) as written, its `$n` placeholders unbound.
pub fn write(stmt: &Stmt, style: &Style) -> String {
    let expr = |e: &Expr| match (e, style.now) {
        (Expr::Value(v), _) => literal(v),
        (Expr::NowPlus(ms), NowAs::Interval) if *ms < 0 => format!("now() - interval '{} ms'", -ms),
        (Expr::NowPlus(ms), NowAs::Interval) => format!("now() + interval '{ms} ms'"),
        (Expr::NowPlus(ms), NowAs::MillisSince(0)) => {
            format!("(floor(extract(epoch from now()) * 1000)::bigint + {ms})")
        }
        (Expr::NowPlus(ms), NowAs::MillisSince(o)) => {
            format!("(floor(extract(epoch from now()) * 1000)::bigint - {o} + {ms})")
        }
        (Expr::ColumnPlus(c, d), _) if *d < 0 => format!("{c} - {}", -d),
        (Expr::ColumnPlus(c, d), _) => format!("{c} + {d}"),
    };
    let key = |key: &str| literal(&Value::Text(key.into()));
    let wheres = |k: &str, cond: &[Cond]| {
        let mut parts = vec![format!("k = {}", key(k))];
        parts.extend(cond.iter().map(|c| format!("{} {} {}", c.column, operator(c.op), expr(&c.rhs))));
        parts.join(" AND ")
    };
    let ms = |d: &Duration| match d.as_millis() {
        0 => "0".to_string(),
        ms => format!("'{ms}ms'"),
    };
    let if_not_exists = |yes: bool| if yes { "IF NOT EXISTS " } else { "" };
    match stmt {
        Stmt::Begin => "BEGIN".into(),
        Stmt::Commit => "COMMIT".into(),
        Stmt::Rollback => "ROLLBACK".into(),
        Stmt::Select { table, key: k, for_update } => format!(
            "SELECT {} FROM {table} WHERE {}{}",
            style.select,
            wheres(k, &[]),
            if *for_update { " FOR UPDATE" } else { "" }
        ),
        Stmt::Insert { table, key: k, row } | Stmt::InsertOnConflictDoNothing { table, key: k, row } => {
            let columns: Vec<&str> = ["k"].into_iter().chain(row.iter().map(|(c, _)| c.as_str())).collect();
            let values: Vec<String> = [key(k)].into_iter().chain(row.iter().map(|(_, e)| expr(e))).collect();
            let nothing = if matches!(stmt, Stmt::Insert { .. }) { "" } else { " ON CONFLICT (k) DO NOTHING" };
            format!("INSERT INTO {table} ({}) VALUES ({}){nothing}", columns.join(", "), values.join(", "))
        }
        Stmt::Update { table, key: k, set, cond } => {
            let set: Vec<String> = set.iter().map(|(c, e)| format!("{c} = {}", expr(e))).collect();
            format!("UPDATE {table} SET {} WHERE {}", set.join(", "), wheres(k, cond))
        }
        Stmt::Delete { table, key: k, cond } => format!("DELETE FROM {table} WHERE {}", wheres(k, cond)),
        Stmt::NextVal { sequence } => format!("SELECT nextval({})", key(sequence)),
        Stmt::AdvisoryLock(k) => format!("SELECT pg_advisory_lock({k})"),
        Stmt::TryAdvisoryLock(k) => format!("SELECT pg_try_advisory_lock({k})"),
        Stmt::AdvisoryUnlock(k) => format!("SELECT pg_advisory_unlock({k})"),
        Stmt::AdvisoryXactLock(k) => format!("SELECT pg_advisory_xact_lock({k})"),
        Stmt::TryAdvisoryXactLock(k) => format!("SELECT pg_try_advisory_xact_lock({k})"),
        Stmt::SetLockTimeout(d) => format!("SET lock_timeout = {}", ms(d)),
        Stmt::SetIdleInTransactionSessionTimeout(d) => format!("SET idle_in_transaction_session_timeout = {}", ms(d)),
        Stmt::CreateTable { table, if_not_exists: yes } => {
            format!("CREATE TABLE {}{table} (k text PRIMARY KEY)", if_not_exists(*yes))
        }
        Stmt::CreateSequence { sequence, if_not_exists: yes } => {
            format!("CREATE SEQUENCE {}{sequence}", if_not_exists(*yes))
        }
        // As written, its values apart.
        Stmt::Text(text) => text.sql.clone(),
    }
}

/// A value as an SQL literal, quotes doubled.
fn literal(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Int(n) => n.to_string(),
        Value::Text(t) => format!("'{}'", t.replace('\'', "''")),
    }
}

fn operator(op: Op) -> &'static str {
    match op {
        Op::Eq => "=",
        Op::Ne => "<>",
        Op::Lt => "<",
        Op::Le => "<=",
        Op::Gt => ">",
        Op::Ge => ">=",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        let mut s = Schema::new();
        let create = "create table if not exists job_locks (name text primary key, holder text, fence bigint not null)";
        assert_eq!(s.parse(create), Ok(Stmt::CreateTable { table: "job_locks".into(), if_not_exists: true }));
        s
    }

    #[test]
    fn a_lock_tables_statements_parse_into_the_models() {
        let mut s = schema();
        let key = || "nightly".to_string();
        let table = || "job_locks".to_string();
        let cases = [
            ("BEGIN", Stmt::Begin),
            ("start transaction;", Stmt::Begin),
            (
                "SELECT * FROM job_locks WHERE name = 'nightly' FOR UPDATE",
                Stmt::Select { table: table(), key: key(), for_update: true },
            ),
            (
                "select fence from job_locks where name = 'nightly'",
                Stmt::Select { table: table(), key: key(), for_update: false },
            ),
            (
                "INSERT INTO job_locks VALUES ('nightly', 'client-0', 1)",
                Stmt::Insert {
                    table: table(),
                    key: key(),
                    row: vec![
                        ("holder".into(), Expr::Value(Value::Text("client-0".into()))),
                        ("fence".into(), Expr::Value(Value::Int(1))),
                    ],
                },
            ),
            (
                "UPDATE job_locks SET fence = fence + 1, holder = NULL WHERE name = 'nightly' AND fence >= -2",
                Stmt::Update {
                    table: table(),
                    key: key(),
                    set: vec![
                        ("fence".into(), Expr::ColumnPlus("fence".into(), 1)),
                        ("holder".into(), Expr::Value(Value::Null)),
                    ],
                    cond: vec![Cond { column: "fence".into(), op: Op::Ge, rhs: Expr::Value(Value::Int(-2)) }],
                },
            ),
            (
                "DELETE FROM job_locks WHERE name = 'nightly' AND holder <> 'it''s me'",
                Stmt::Delete {
                    table: table(),
                    key: key(),
                    cond: vec![Cond {
                        column: "holder".into(),
                        op: Op::Ne,
                        rhs: Expr::Value(Value::Text("it's me".into())),
                    }],
                },
            ),
            ("SELECT nextval('fence')", Stmt::NextVal { sequence: "fence".into() }),
            ("SELECT pg_try_advisory_lock(-42)", Stmt::TryAdvisoryLock(-42)),
            ("SELECT pg_advisory_xact_lock(7)", Stmt::AdvisoryXactLock(7)),
            ("SELECT pg_try_advisory_xact_lock(7)", Stmt::TryAdvisoryXactLock(7)),
            ("SET lock_timeout = '2s'", Stmt::SetLockTimeout(Duration::from_secs(2))),
            ("SET idle_in_transaction_session_timeout TO 0", Stmt::SetIdleInTransactionSessionTimeout(Duration::ZERO)),
            ("CREATE SEQUENCE fence", Stmt::CreateSequence { sequence: "fence".into(), if_not_exists: false }),
        ];
        for (text, stmt) in cases {
            assert_eq!(s.parse(text), Ok(stmt), "{text}");
        }
        let lease =
            s.parse("UPDATE job_locks SET fence = 1 WHERE name = 'nightly' AND fence < now() - interval '30 seconds'");
        let Ok(Stmt::Update { cond, .. }) = lease else { panic!("{lease:?}") };
        assert_eq!(cond[0].rhs, Expr::NowPlus(-30_000));
    }

    #[test]
    fn what_the_model_cannot_run_is_an_error_at_its_column() {
        let mut s = schema();
        let cases = [
            ("SELEC * FROM job_locks", 1, "expected BEGIN, COMMIT, ROLLBACK, CREATE, SELECT, INSERT, UPDATE, DELETE or SET, found `selec` (the model's SQL is listed in locksim_sim::backend::sql::text)"),
            ("SELECT * FROM jobs WHERE name = 'x'", 15, "table jobs is not in the schema: parse its CREATE TABLE first"),
            ("SELECT * FROM job_locks WHERE holder = 'x'", 31, "expected the row's key first (`name = '…'`): the model finds rows by their key"),
            ("UPDATE job_locks SET fenc = 1 WHERE name = 'x'", 22, "column fenc does not exist; expected one of name, holder, fence"),
            ("DELETE FROM job_locks WHERE name = 'x' OR fence = 1", 40, "expected the end of the statement, found `or`"),
            ("SELECT * FROM job_locks WHERE name = 'x", 38, "a string that is never closed (expected a closing `'`)"),
            ("BEGIN; COMMIT", 6, "unexpected one statement at a time (a `;` only at the end)"),
            ("SET statement_timeout = 0", 5, "the model has the settings lock_timeout and idle_in_transaction_session_timeout, not statement_timeout"),
            ("UPDATE job_locks SET holder = fence WHERE name = 'x'", 37, "expected `+` or `-` and an integer after the column (a bare column is not a value the model computes), found `where`"),
            ("CREATE TABLE t (a bigint)", 25, "expected a `text PRIMARY KEY` column before `)` (the model finds rows by one text key), found `)`"),
            ("INSERT INTO job_locks (holder) VALUES ('me')", 45, "expected a value for the key column name, found the end"),
            (
                "INSERT INTO job_locks (name) VALUES ('x', 1)",
                43,
                "expected `)` ending the values: the column list names 1 column(s), found 1",
            ),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter_map(|(text, column, message)| match s.parse(text) {
                Err(e) if (e.column, e.message.as_str()) == (*column, *message) => None,
                other => Some(format!("{text}: {other:?}")),
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
        let e = s.parse("SELECT * FROM jobs").unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"SELECT * FROM jobs\", column 15: table jobs is not in the schema: parse its CREATE TABLE first"
        );
    }

    /// A lease table as users write it (ShedLock's PostgreSQL table), and ShedLock's statements.
    const SHEDLOCK: &str = "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL, lock_until TIMESTAMP NOT \
                            NULL, locked_at timestamp(3) with time zone NOT NULL, locked_by character varying(255) \
                            NOT NULL, fence bigint, CONSTRAINT shedlock_pk PRIMARY KEY (name));";

    #[test]
    fn tables_and_statements_as_users_write_them_parse_with_bind_parameters() {
        let mut s = Schema::new();
        assert_eq!(s.parse(SHEDLOCK), Ok(Stmt::CreateTable { table: "shedlock".into(), if_not_exists: true }));
        let insert = "INSERT INTO shedlock(name, lock_until, locked_at, locked_by) VALUES($1, now() + interval \
                      '30 seconds', now(), $2) ON CONFLICT (name) DO NOTHING";
        let insert = s.prepare(insert).unwrap();
        assert_eq!(insert.params(), 2);
        let row = |by: &str| {
            vec![
                ("lock_until".to_string(), Expr::NowPlus(30_000)),
                ("locked_at".to_string(), Expr::NowPlus(0)),
                ("locked_by".to_string(), Expr::Value(Value::Text(by.into()))),
            ]
        };
        let bound = insert.bind(&[&"nightly", &"host-1".to_string()]).unwrap();
        let Stmt::Text(text) = bound else { panic!("{bound:?}") };
        assert_eq!(
            (text.sql.as_str(), &text.params),
            (insert.sql(), &vec![Value::Text("nightly".into()), Value::Text("host-1".into())])
        );
        let model =
            Stmt::InsertOnConflictDoNothing { table: "shedlock".into(), key: "nightly".into(), row: row("host-1") };
        assert_eq!(text.stmt, model);
        let update =
            "UPDATE shedlock SET lock_until = now() + interval '30 seconds', locked_at = now(), locked_by = $2 \
                      WHERE shedlock.name = $1 AND shedlock.lock_until <= now()";
        let update = s.prepare(update).unwrap().bind(&[&"nightly", &"host-1"]).unwrap();
        let cond = vec![Cond { column: "lock_until".into(), op: Op::Le, rhs: Expr::NowPlus(0) }];
        let model = Stmt::Update { table: "shedlock".into(), key: "nightly".into(), set: row("host-1"), cond };
        assert_eq!(update.model(), &model);
        let fenced = s.prepare("UPDATE shedlock SET fence = $2 WHERE name = $1 AND locked_by = $3").unwrap();
        let fenced = fenced.bind(&[&"nightly", &7i64, &None::<String>]).unwrap();
        let Stmt::Update { set, cond, .. } = fenced.model() else { panic!("{fenced:?}") };
        assert_eq!((&set[0].1, &cond[0].rhs), (&Expr::Value(Value::Int(7)), &Expr::Value(Value::Null)));
        let advisory = s.prepare("SELECT pg_try_advisory_lock($1)").unwrap().bind(&[&42i64]).unwrap();
        assert_eq!(advisory.model(), &Stmt::TryAdvisoryLock(42));
        // Keys need not be called `k`, nor be declared first.
        s.parse("create table jobs (id integer, job text primary key)").unwrap();
        let select = s.parse("SELECT id, jobs.job FROM jobs WHERE job = 'x' FOR UPDATE").unwrap();
        assert_eq!(select, Stmt::Select { table: "jobs".into(), key: "x".into(), for_update: true });
    }

    #[test]
    fn what_the_model_cannot_keep_of_a_table_or_a_binding_is_an_error_at_its_column() {
        let mut s = Schema::new();
        s.parse(SHEDLOCK).unwrap();
        let cases = [
            ("CREATE TABLE t (a varchar(9), b bigint, PRIMARY KEY (a, b))", 55, "expected `)` after the key column (the model finds rows by one text key), found `,`"),
            ("CREATE TABLE t (id bigint PRIMARY KEY)", 17, "the model keys rows by text; make id `text PRIMARY KEY` (or varchar)"),
            ("CREATE TABLE t (a text PRIMARY KEY, b uuid)", 39, "expected the column's type (text, varchar(n), bigint, integer, smallint, timestamp, timestamptz), found `uuid`"),
            ("CREATE TABLE t (a text PRIMARY KEY, at timestamp DEFAULT now())", 50, "expected PRIMARY KEY, NOT NULL, `,` or `)`, found `default` (the model keeps no defaults or other constraints)"),
            ("CREATE TABLE t (a text UNIQUE, PRIMARY KEY (a))", 24, "expected PRIMARY KEY, NOT NULL, `,` or `)`, found `unique` (the model keeps no defaults or other constraints)"),
            ("CREATE TABLE t (n bigint, PRIMARY KEY (name))", 27, "the key column name is not declared; expected one of n"),
            ("CREATE TABLE t (a text PRIMARY KEY, b text, PRIMARY KEY (b))", 45, "expected one PRIMARY KEY, found a second"),
            ("INSERT INTO shedlock (name) VALUES ('x') ON CONFLICT (locked_by) DO NOTHING", 55, "expected the key column name: the model's one unique constraint is its key"),
            ("INSERT INTO shedlock (name) VALUES ('x') ON CONFLICT (name) DO UPDATE SET fence = 1", 64, "expected `NOTHING` (the model runs ON CONFLICT … DO NOTHING, not DO UPDATE), found `update`"),
            ("SELECT * FROM shedlock WHERE name = $1", 37, "a bind parameter ($1) in SQL parsed without values: prepare it (Schema::prepare) and bind them"),
            ("DELETE FROM shedlock WHERE name = $0", 35, "expected a bind parameter, `$` and its number from 1 (`$1`)"),
            ("SELECT * FROM shedlock WHERE jobs.name = 'x'", 30, "expected a column of shedlock, found jobs.…"),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter_map(|(text, column, message)| match s.parse(text) {
                Err(e) if (e.column, e.message.as_str()) == (*column, *message) => None,
                other => Some(format!("{text}: {other:?}")),
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
        let update = s.prepare("UPDATE shedlock SET fence = $2, lock_until = $3 WHERE name = $1").unwrap();
        let bound = |params: &[&dyn ToValue]| update.bind(params).map_err(|e| (e.column, e.message));
        let cases: [(&[&dyn ToValue], usize, &str); 4] = [
            (&[&"x", &1i64], 1, "expected 3 value(s), for $1 to $3, found 2"),
            (&[&5i64, &1i64, &None::<i64>], 62, "expected a text value for $1 (the key, where the text has the key, a text literal ('…')), found Int(5)"),
            (&[&"x", &"1", &None::<i64>], 29, "column fence is an integer type: expected a value of it for $2, found Text(\"1\")"),
            (&[&"x", &1i64, &1i64], 46, "column lock_until is a timestamp: the model's times are now() ± interval '…', not a value bound to $3"),
        ];
        for (params, column, message) in cases {
            assert_eq!(bound(params), Err((column, message.to_string())));
        }
    }

    #[test]
    fn written_statements_read_back_as_themselves_and_as_postgresql_takes_them() {
        let mut s = Schema::new();
        s.parse("CREATE TABLE locks (k text PRIMARY KEY, owner text, until bigint)").unwrap();
        let now = Style { select: "*", now: NowAs::Interval };
        let cond = |column: &str, op, rhs| Cond { column: column.into(), op, rhs };
        let stmts = [
            Stmt::Select { table: "locks".into(), key: "it's".into(), for_update: true },
            Stmt::Insert {
                table: "locks".into(),
                key: "lock".into(),
                row: vec![
                    ("owner".into(), Expr::Value(Value::Text("c-0".into()))),
                    ("until".into(), Expr::NowPlus(-5)),
                ],
            },
            Stmt::Update {
                table: "locks".into(),
                key: "lock".into(),
                set: vec![("until".into(), Expr::ColumnPlus("until".into(), -3))],
                cond: vec![cond("until", Op::Le, Expr::NowPlus(1500)), cond("owner", Op::Ne, Expr::Value(Value::Null))],
            },
            Stmt::Delete { table: "locks".into(), key: "lock".into(), cond: vec![] },
            Stmt::NextVal { sequence: "fence".into() },
            Stmt::TryAdvisoryLock(42),
            Stmt::SetLockTimeout(Duration::from_millis(1500)),
            Stmt::SetIdleInTransactionSessionTimeout(Duration::ZERO),
            Stmt::CreateSequence { sequence: "fence".into(), if_not_exists: true },
            Stmt::InsertOnConflictDoNothing { table: "locks".into(), key: "lock".into(), row: vec![] },
        ];
        for stmt in stmts {
            let text = write(&stmt, &now);
            assert_eq!(s.parse(&text), Ok(stmt), "{text}");
        }
        let select = Stmt::Select { table: "lock_rows".into(), key: "lock".into(), for_update: true };
        assert_eq!(write(&select, &Style::REAL), "SELECT * FROM lock_rows WHERE k = 'lock' FOR UPDATE");
        let expiry = Stmt::Delete {
            table: "locks".into(),
            key: "lock".into(),
            cond: vec![cond("until", Op::Lt, Expr::NowPlus(0))],
        };
        assert_eq!(
            write(&expiry, &Style { select: "*", now: NowAs::MillisSince(1000) }),
            "DELETE FROM locks WHERE k = 'lock' AND until < (floor(extract(epoch from now()) * 1000)::bigint - 1000 + 0)"
        );
        assert_eq!(write(&Stmt::AdvisoryUnlock(42), &Style::REAL), "SELECT pg_advisory_unlock(42)");
    }
}
