//! Counting selections with bitsets. Every term a selection names (`succeeded:Checked`,
//! `running:checker`, ...) becomes a bitset of one segment's documents, cached for the life of
//! that segment (a segment's postings never change; deletions are applied when counting), and
//! the selection is evaluated as bitwise and / or / not. A monitor's overview asks some seventy
//! counts that share a few dozen terms: each term is decoded once per segment, not once per
//! count, and the counts themselves are word-wise popcounts. `Selection::matches_at` stays the
//! meaning; the index's equivalence property test holds this to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use autocomp_model::{EventType, Selection, Timestamp, Trigger};
use tantivy::columnar::Column;
use tantivy::index::SegmentId;
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::{Searcher, SegmentReader, Term};

use crate::browse::Tally;
use crate::document::{Fields, acknowledged_term};

/// One bit per document of a segment.
#[derive(Clone)]
struct Bits {
    words: Vec<u64>,
    len: u32,
}

impl Bits {
    fn zeros(len: u32) -> Bits {
        Bits { words: vec![0; (len as usize).div_ceil(64)], len }
    }

    fn ones(len: u32) -> Bits {
        let mut bits = Bits { words: vec![u64::MAX; (len as usize).div_ceil(64)], len };
        bits.clear_tail();
        bits
    }

    /// Bits past `len` stay zero, so `not` and counts never see documents that do not exist.
    fn clear_tail(&mut self) {
        let used = self.len % 64;
        if used != 0
            && let Some(last) = self.words.last_mut()
        {
            *last &= (1u64 << used) - 1;
        }
    }

    fn set(&mut self, doc: u32) {
        self.words[(doc / 64) as usize] |= 1 << (doc % 64);
    }

    fn and(mut self, other: &Bits) -> Bits {
        self.words.iter_mut().zip(&other.words).for_each(|(a, b)| *a &= b);
        self
    }

    fn or(mut self, other: &Bits) -> Bits {
        self.words.iter_mut().zip(&other.words).for_each(|(a, b)| *a |= b);
        self
    }

    fn not(mut self) -> Bits {
        self.words.iter_mut().for_each(|w| *w = !*w);
        self.clear_tail();
        self
    }

    fn docs(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                (rest != 0).then(|| {
                    let bit = rest.trailing_zeros();
                    rest &= rest - 1;
                    i as u32 * 64 + bit
                })
            })
        })
    }
}

/// One segment's bitsets by term (field and text).
type SegmentTerms = HashMap<(Field, String), Arc<Bits>>;

/// Term bitsets of the segments a searcher saw last, kept while those segments live.
#[derive(Default)]
pub struct TermBitsets {
    segments: Mutex<HashMap<SegmentId, Arc<Mutex<SegmentTerms>>>>,
}

impl TermBitsets {
    /// Each selection's size at store time `now` (and its quietest batch's last activity
    /// when `quietest`), over every segment of `searcher`.
    pub fn tally(
        &self,
        searcher: &Searcher,
        fields: &Fields,
        selections: &[Selection],
        now: Timestamp,
        quietest: bool,
    ) -> tantivy::Result<Vec<Tally>> {
        let mut tallies = vec![Tally { count: 0, quietest: None }; selections.len()];
        let live: Vec<SegmentId> = searcher.segment_readers().iter().map(SegmentReader::segment_id).collect();
        let caches: Vec<_> = {
            let mut segments = self.segments.lock().expect("term bitsets");
            // Merged-away segments are gone for good: their bitsets go with them.
            segments.retain(|id, _| live.contains(id));
            live.iter().map(|id| Arc::clone(segments.entry(*id).or_default())).collect()
        };
        for (reader, cache) in searcher.segment_readers().iter().zip(caches) {
            let mut cache = cache.lock().expect("segment term bitsets");
            let mut segment = Segment::open(reader, fields, &mut cache, now)?;
            let alive = segment.alive();
            for (selection, tally) in selections.iter().zip(&mut tallies) {
                let bits = segment.eval(selection)?.and(&alive);
                tally.count += bits.words.iter().map(|w| u64::from(w.count_ones())).sum::<u64>();
                if quietest {
                    let oldest = bits.docs().filter_map(|doc| segment.last_activity.first(doc)).min().map(Timestamp);
                    tally.quietest = match (tally.quietest, oldest) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
        Ok(tallies)
    }
}

/// One segment while a tally evaluates selections over it.
struct Segment<'a> {
    reader: &'a SegmentReader,
    fields: &'a Fields,
    terms: &'a mut SegmentTerms,
    /// "Quiet since" bitsets by their bound, for this tally only (they move with the clock).
    quiet: HashMap<i64, Arc<Bits>>,
    last_activity: Column<i64>,
    priority: Column<i64>,
    now: Timestamp,
    len: u32,
}

impl<'a> Segment<'a> {
    fn open(
        reader: &'a SegmentReader,
        fields: &'a Fields,
        terms: &'a mut SegmentTerms,
        now: Timestamp,
    ) -> tantivy::Result<Segment<'a>> {
        Ok(Segment {
            reader,
            fields,
            terms,
            quiet: HashMap::new(),
            last_activity: reader.fast_fields().i64("last_activity")?,
            priority: reader.fast_fields().i64("priority")?,
            now,
            len: reader.max_doc(),
        })
    }

    fn alive(&self) -> Bits {
        match self.reader.alive_bitset() {
            None => Bits::ones(self.len),
            Some(alive) => {
                let mut bits = Bits::zeros(self.len);
                alive.iter_alive().for_each(|doc| bits.set(doc));
                bits
            }
        }
    }

    fn term(&mut self, field: Field, text: &str) -> tantivy::Result<Arc<Bits>> {
        let key = (field, text.to_owned());
        if let Some(bits) = self.terms.get(&key) {
            return Ok(Arc::clone(bits));
        }
        let mut bits = Bits::zeros(self.len);
        let inverted = self.reader.inverted_index(field)?;
        if let Some(mut postings) =
            inverted.read_block_postings(&Term::from_field_text(field, text), IndexRecordOption::Basic)?
        {
            // Whole decoded blocks of 128 documents at a time: the cheapest way through a
            // dense posting list.
            while !postings.docs().is_empty() {
                postings.docs().iter().for_each(|&doc| bits.set(doc));
                postings.advance();
            }
        }
        let bits = Arc::new(bits);
        self.terms.insert(key, Arc::clone(&bits));
        Ok(bits)
    }

    /// Documents whose last activity is at or before `latest` (store millis).
    fn quiet_since(&mut self, latest: i64) -> Arc<Bits> {
        if let Some(bits) = self.quiet.get(&latest) {
            return Arc::clone(bits);
        }
        let mut bits = Bits::zeros(self.len);
        for doc in 0..self.len {
            if self.last_activity.first(doc).is_some_and(|at| at <= latest) {
                bits.set(doc);
            }
        }
        let bits = Arc::new(bits);
        self.quiet.insert(latest, Arc::clone(&bits));
        bits
    }

    fn quiet_for(&mut self, quiet: std::time::Duration) -> Arc<Bits> {
        // As the query translation: store times are whole milliseconds, rounded up.
        let quiet_ms = i64::try_from(quiet.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
        self.quiet_since(self.now.millis().saturating_sub(quiet_ms))
    }

    fn any_term(&mut self, field: Field, texts: impl Iterator<Item = String>) -> tantivy::Result<Bits> {
        let mut bits = Bits::zeros(self.len);
        for text in texts {
            bits = bits.or(&*self.term(field, &text)?);
        }
        Ok(bits)
    }

    fn trigger(&mut self, trigger: &Trigger) -> tantivy::Result<Bits> {
        let fields = self.fields;
        let mut bits = Bits::ones(self.len);
        if !trigger.types.is_empty() {
            bits = bits.and(&self.any_term(fields.batch_type, trigger.types.iter().map(|t| t.to_string()))?);
        }
        if !trigger.batches.is_empty() {
            bits = bits.and(&self.any_term(fields.id, trigger.batches.iter().map(|b| b.to_string()))?);
        }
        for required in &trigger.requires {
            bits = bits.and(&*self.term(fields.succeeded, required.as_str())?);
        }
        for blocking in &trigger.blocked_by {
            bits = bits.and(&(*self.term(fields.present, blocking.as_str())?).clone().not());
        }
        for repeated in &trigger.repeat_on_change {
            bits = bits.and(&(*self.term(fields.current, repeated.as_str())?).clone().not());
        }
        for retried in &trigger.transiently_failed {
            bits = bits.and(&*self.term(fields.transient, retried.as_str())?);
        }
        if let Some(quiet) = trigger.settled_for.filter(|quiet| !quiet.is_zero()) {
            bits = bits.and(&self.quiet_for(quiet));
        }
        // A batch whose history was pruned is ready for nothing (`Trigger::failing_clause`).
        bits = bits.and(&(*self.term(fields.present, EventType::HISTORY_PRUNED)?).clone().not());
        Ok(bits)
    }

    fn eval(&mut self, selection: &Selection) -> tantivy::Result<Bits> {
        let fields = self.fields;
        Ok(match selection {
            Selection::All => Bits::ones(self.len),
            Selection::Trigger(trigger) => self.trigger(trigger)?,
            Selection::Running(component) => (*self.term(fields.running, component.as_str())?).clone(),
            Selection::Present(t) => (*self.term(fields.present, t.as_str())?).clone(),
            Selection::Succeeded(t) => (*self.term(fields.succeeded, t.as_str())?).clone(),
            Selection::Failed(t) => (*self.term(fields.failed, t.as_str())?).clone(),
            Selection::TransientlyFailed(t) => (*self.term(fields.transient, t.as_str())?).clone(),
            Selection::Skipped(t) => (*self.term(fields.skipped, t.as_str())?).clone(),
            Selection::Acknowledged(t) => (*self.term(fields.failed, &acknowledged_term(t.as_str()))?).clone(),
            Selection::Stale(t) => (*self.term(fields.stale, t.as_str())?).clone(),
            Selection::BatchType(t) => (*self.term(fields.batch_type, t.as_str())?).clone(),
            Selection::IdPrefix(prefix) => {
                let mut bits = Bits::zeros(self.len);
                let inverted = self.reader.inverted_index(fields.id)?;
                let mut terms = inverted.terms().range().ge(prefix.as_bytes()).into_stream()?;
                while terms.advance() {
                    if !terms.key().starts_with(prefix.as_bytes()) {
                        break;
                    }
                    let mut postings =
                        inverted.read_block_postings_from_terminfo(terms.value(), IndexRecordOption::Basic)?;
                    while !postings.docs().is_empty() {
                        postings.docs().iter().for_each(|&doc| bits.set(doc));
                        postings.advance();
                    }
                }
                bits
            }
            Selection::Priority { min, max } => {
                let (min, max) = (min.map_or(i64::MIN, i64::from), max.map_or(i64::MAX, i64::from));
                let mut bits = Bits::zeros(self.len);
                for doc in 0..self.len {
                    if self.priority.first(doc).is_some_and(|p| (min..=max).contains(&p)) {
                        bits.set(doc);
                    }
                }
                bits
            }
            Selection::QuietFor(quiet) => (*self.quiet_for(*quiet)).clone(),
            Selection::And(all) => {
                let mut bits = Bits::ones(self.len);
                for selection in all {
                    bits = bits.and(&self.eval(selection)?);
                }
                bits
            }
            Selection::Or(any) => {
                let mut bits = Bits::zeros(self.len);
                for selection in any {
                    bits = bits.or(&self.eval(selection)?);
                }
                bits
            }
            Selection::Not(inner) => self.eval(inner)?.not(),
        })
    }
}
