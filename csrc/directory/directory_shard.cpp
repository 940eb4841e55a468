#include "directory/directory_shard.h"

#include <algorithm>
#include <tuple>

namespace hoplite {
DirectoryShard::~DirectoryShard() {
  for (auto& [id, list] : waiters_) {
    for (auto& w : list) loop_.cancelTimer(w.timer);
  }
  for (auto& [id, timer] : graceTimers_) loop_.cancelTimer(timer);
}

Status DirectoryShard::registerObject(const wire::Register& msg) {
  if (auto it = entries_.find(msg.id); it != entries_.end()) {
    DirectoryEntry& entry = it->second;
    // The same registration twice (its holder re-sent it here after the
    // previous shard failed, and also re-announced its copy) is no conflict.
    const bool again = entry.holders.count(msg.holder) && sameContents(entry.meta, msg.meta);
    if (!msg.reannounce && !again) return Status(Code::kAlreadyExists, "object " + printableId(msg.id) + " already exists");
    entry.relisted = entry.relisted && msg.reannounce && !msg.putPending;  // a put's is no listing again
    Holder& h = listHolder(entry, msg.holder);
    if (entry.token == 0) entry.token = msg.token;  // its origin re-registered it here after a move
    h.complete = h.complete || msg.complete;
    h.origin = h.origin || msg.primary;
    if (msg.complete) entry.recomputable = false;
    if (msg.hasInline && !entry.hasInline) {
      entry.hasInline = true;
      entry.inlineData = msg.inlineData;
    }
    tellSubscribers(msg.id);
    return Status();
  }
  if (const Gone* gone = gone_.find(msg.id)) {
    // (A put waiting for its answer is of a new object, deleted or not before.)
    if (msg.reannounce && !msg.putPending && gone->code == Code::kDeleted && !gone->fromStandby) {
      return goneStatus(msg.id, *gone);
    }
    gone_.forget(msg.id);  // put again: a new object from now on
  }
  forgetExpected(msg.id);
  DirectoryEntry& entry = entries_[msg.id];
  entry.meta = msg.meta;
  entry.holders[msg.holder] = Holder{msg.complete, 0, msg.primary};
  entry.hasInline = msg.hasInline;
  entry.inlineData = msg.inlineData;
  entry.recomputable = msg.recomputable && !msg.complete;
  entry.token = msg.token;
  entry.relisted = msg.reannounce && !msg.putPending;

  auto it = waiters_.find(msg.id);
  if (it != waiters_.end()) {
    std::vector<Waiter> list = std::move(it->second);
    waiters_.erase(it);
    waiting_ -= list.size();
    for (auto& w : list) {
      loop_.cancelTimer(w.timer);
      int sender = answerFor(entry, w.asker, w.locate, w.preferred);
      w.reply(Status(), &entry, sender);
    }
  }
  tellSubscribers(msg.id);
  return Status();
}

bool DirectoryShard::updateHolder(const wire::HolderUpdate& msg) {
  auto it = entries_.find(msg.id);
  if (it == entries_.end()) return false;
  auto& holders = it->second.holders;
  if (msg.released >= 0) {
    auto sender = holders.find(msg.released);
    if (sender != holders.end() && sender->second.serving > 0) sender->second.serving--;
  }
  if (!holders.count(msg.holder)) return true;  // not listed (e.g. dropped by a retract since): nothing to change
  if (msg.state == wire::HolderState::kRemoved) {
    holders.erase(msg.holder);
    if (lost(it->second)) dropLost(it, -1);
  } else {
    Holder& h = holders[msg.holder];
    h.complete = msg.state == wire::HolderState::kComplete;
    if (h.complete) {
      h.source = -1;
      h.sourceNamed = false;
      it->second.recomputable = false;  // a reduce's result is complete: nothing recomputes it any more
    }
  }
  tellSubscribers(msg.id);
  return true;
}

int DirectoryShard::assignSender(DirectoryEntry& entry, int asker, int skip, int preferred) {
  if (entry.hasInline) return -1;
  // An idle complete copy first, then an idle partial one (an earlier receiver,
  // which relays chunk by chunk), then whoever serves the fewest. A new asker
  // feeds nobody yet; one resuming after its sender died may, so holders whose
  // supply runs through it are skipped: relays form no cycles.
  int best = -1;
  auto rank = [](const Holder& h) { return std::make_pair(h.serving, h.complete ? 0 : 1); };
  if (preferred >= 0 && preferred != asker && preferred != skip && !feedsFrom(entry, preferred, asker)) {
    best = preferred;
  } else {
    for (const auto& [r, h] : entry.holders) {
      if (r == asker || r == skip || feedsFrom(entry, r, asker)) continue;
      if (best < 0 || rank(h) < rank(entry.holders.at(best))) best = r;
    }
  }
  if (best >= 0) {
    const bool listed = entry.holders.count(best) > 0;
    if (listed) entry.holders[best].serving++;
    Holder& self = listHolder(entry, asker);  // a partial holder from now on
    self.complete = false;
    // A second lookup from a node already pulling gives its sender back at
    // once: the first assignment stays the one its supply runs through
    // (unless that sender was forgotten since, which a named one not yet
    // listed was not).
    if (self.source < 0 || !(entry.holders.count(self.source) || self.sourceNamed)) {
      self.source = best;
      self.sourceNamed = !listed;
    }
  }
  return best;
}

Holder& DirectoryShard::listHolder(DirectoryEntry& entry, int rank) {
  auto [it, added] = entry.holders.try_emplace(rank);
  if (!added) return it->second;
  for (auto& [r, h] : entry.holders) {
    if (h.complete || h.source != rank) continue;
    it->second.serving++;
    h.sourceNamed = false;  // listed now: forgotten like any holder if it fails
  }
  return it->second;
}

int DirectoryShard::sourceOf(const DirectoryEntry& entry, int holder) {
  auto it = entry.holders.find(holder);
  return it == entry.holders.end() || it->second.complete ? -1 : it->second.source;
}

bool DirectoryShard::feedsFrom(const DirectoryEntry& entry, int holder, int asker) {
  size_t steps = 0;
  for (int r = holder; r >= 0 && steps <= entry.holders.size(); ++steps) {
    if (r == asker) return true;
    auto it = entry.holders.find(r);
    if (it == entry.holders.end() || it->second.complete) return false;
    r = it->second.source;
  }
  return steps > entry.holders.size();  // a loop: treat as unsafe
}

int DirectoryShard::anyHolder(const DirectoryEntry& entry, int skip) {
  int best = -1;
  auto rank = [](const Holder& h) { return std::make_tuple(h.complete ? 0 : 1, h.origin ? 0 : 1, h.serving); };
  for (const auto& [r, h] : entry.holders) {
    if (r == skip) continue;
    if (best < 0 || rank(h) < rank(entry.holders.at(best))) best = r;
  }
  return best;
}

void DirectoryShard::lookup(const std::string& id, int asker, bool locate, double timeoutSeconds, LookupCallback reply,
                            int failedHolder, int preferred) {
  auto it = entries_.find(id);
  if (it != entries_.end() && failedHolder >= 0 && locate) {
    const int holder = anyHolder(it->second, failedHolder);
    if (holder >= 0 || it->second.hasInline) {  // inline bytes need no holder
      reply(Status(), &it->second, holder);
      return;
    }
    it = entries_.end();  // no live copy known: wait for one, as for an object not put yet
  }
  if (it != entries_.end() && failedHolder >= 0 && !locate) {
    DirectoryEntry& entry = it->second;
    auto self = entry.holders.find(asker);
    if (self != entry.holders.end() && self->second.source == failedHolder) {
      self->second.source = -1;
      self->second.sourceNamed = false;
    }
    reply(Status(), &entry, assignSender(entry, asker, failedHolder));
    tellSubscribers(id);  // the asker is a partial holder now
    return;
  }
  if (it != entries_.end()) {
    int sender = answerFor(it->second, asker, locate, preferred);
    reply(Status(), &it->second, sender);
    if (!locate) tellSubscribers(id);
    return;
  }
  if (const Gone* gone = gone_.find(id); gone != nullptr && !(locate && gone->code == Code::kPeerFailed)) {
    reply(goneStatus(id, *gone), nullptr, -1);
    return;
  }
  uint64_t token = nextWaiter_++;
  auto timer = loop_.addTimer(timeoutSeconds, [this, id, token] {
    auto wit = waiters_.find(id);
    if (wit == waiters_.end()) return;
    auto& list = wit->second;
    for (auto w = list.begin(); w != list.end(); ++w) {
      if (w->token != token) continue;
      LookupCallback cb = std::move(w->reply);
      list.erase(w);
      waiting_--;
      if (list.empty()) waiters_.erase(wit);
      cb(Status(Code::kTimeout, "object " + printableId(id) + " does not exist"), nullptr, -1);
      return;
    }
  });
  waiters_[id].push_back(Waiter{token, asker, locate, preferred, std::move(reply), timer});
  waiting_++;
}

std::vector<wire::GoneId> DirectoryShard::handOver(const std::function<bool(const std::string& id)>& leaves,
                                                   int leaving) {
  std::vector<wire::GoneId> handed;
  std::erase_if(expected_, [&](const auto& x) { return leaves(x.first); });  // their holders list them there
  std::erase_if(watches_, [&](const auto& w) { return leaves(w.first); });   // their subscribers rehome
  for (auto e = entries_.begin(); e != entries_.end();) {
    if (!leaves(e->first)) {
      ++e;
      continue;
    }
    const auto& holders = e->second.holders;
    const bool onlyLeaver = leaving >= 0 && holders.size() == 1 && holders.count(leaving) && !e->second.recomputable;
    if (onlyLeaver) handed.push_back(wire::GoneId{e->first, /*deleted=*/false, leaving, /*lastHolderLeft=*/true});
    e = entries_.erase(e);
  }
  gone_.forgetIf([&](std::string_view id, const Gone& gone) {
    std::string name(id);
    if (!leaves(name)) return false;
    if (gone.failedReduce) return true;  // soft: the new host's lookups wait as for any absent id
    handed.push_back(wire::GoneId{std::move(name), gone.code == Code::kDeleted, gone.rank, gone.left, gone.deletedBy});
    return true;
  });
  std::vector<std::pair<std::string, std::vector<Waiter>>> moved;
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    if (!leaves(w->first)) {
      ++w;
      continue;
    }
    waiting_ -= w->second.size();
    moved.emplace_back(w->first, std::move(w->second));
    w = waiters_.erase(w);
  }
  for (auto& [id, list] : moved) {
    for (auto& w : list) {
      loop_.cancelTimer(w.timer);
      w.reply(Status(Code::kMoved, "the directory entry of " + printableId(id) + " moved to another rank"), nullptr, -1);
    }
  }
  return handed;
}

bool DirectoryShard::isDeleted(const std::string& id) const {
  const Gone* gone = gone_.find(id);
  return gone != nullptr && gone->code == Code::kDeleted;
}

bool DirectoryShard::isLost(const std::string& id) const {
  const Gone* gone = gone_.find(id);
  return gone != nullptr && gone->code != Code::kDeleted && !gone->failedReduce;
}

void DirectoryShard::failResult(const std::string& id, const Status& why) {
  if (entries_.count(id) || expected_.count(id)) return;
  if (Gone* gone = gone_.find(id); gone != nullptr && !gone->failedReduce) {
    // Its coordinator deleted the result it had registered (or a holder of it
    // was lost): that stands, and says why.
    if (gone->code == Code::kDeleted) gone->why = why.message;
    return;
  }
  const Gone& now = gone_.remember(id, Gone{.code = why.code, .failedReduce = true, .why = why.message});
  failWaiters(id, goneStatus(id, now), /*keepLocates=*/false);
}

void DirectoryShard::failWaiters(const std::string& id, const Status& why, bool keepLocates) {
  auto w = waiters_.find(id);
  if (w == waiters_.end()) return;
  std::vector<Waiter> answered, kept;
  for (auto& waiter : w->second) (keepLocates && waiter.locate ? kept : answered).push_back(std::move(waiter));
  waiting_ -= answered.size();
  if (kept.empty()) {
    waiters_.erase(w);
  } else {
    w->second = std::move(kept);
  }
  for (auto& waiter : answered) {
    loop_.cancelTimer(waiter.timer);
    waiter.reply(why, nullptr, -1);
  }
}

void DirectoryShard::keepStandby(const wire::GoneId& gone) {
  if (!gone.deleted && gone.lastHolder < 0) {
    standby_.forget(gone.id);
    return;
  }
  standby_.remember(gone.id, StandbyRecord{gone.deleted, gone.lastHolder, gone.deletedBy});
}

std::vector<wire::GoneId> DirectoryShard::standbyRecords() const {
  std::vector<wire::GoneId> records;
  for (const auto& [id, entry] : entries_) {
    if (entry.standbyHolder >= 0) records.push_back(wire::GoneId{id, false, entry.standbyHolder, false, 0});
  }
  for (const auto& [id, holder] : expected_) records.push_back(wire::GoneId{id, false, holder, false, 0});
  gone_.forEach([&](std::string_view id, const Gone& gone) {
    if (gone.code == Code::kDeleted) records.push_back(wire::GoneId{std::string(id), true, -1, false, gone.deletedBy});
  });
  return records;
}

DirectoryShard::Sizes DirectoryShard::sizes() const {
  Sizes sizes{entries_.size(), 0, gone_.size(), standby_.size(), watches_.size()};
  for (const auto& [id, entry] : entries_) sizes.inlineBytes += entry.inlineData.size();
  return sizes;
}

void DirectoryShard::dropStandby() { standby_.clear(); }

std::vector<wire::GoneId> DirectoryShard::adoptStandby(const std::function<bool(const std::string& id)>& hosted,
                                                       const std::function<Fate(int rank)>& fateOf,
                                                       double graceSeconds) {
  std::vector<std::pair<std::string, StandbyRecord>> adopted;
  standby_.forgetIf([&](std::string_view id, const StandbyRecord& record) {
    std::string name(id);
    if (!hosted(name)) return false;
    adopted.emplace_back(std::move(name), record);
    return true;
  });
  std::vector<wire::GoneId> kept;
  for (const auto& [id, record] : adopted) {
    if (record.deleted) {
      wire::GoneId gone{id, /*deleted=*/true, -1, false, record.deletedBy};
      if (adoptGone(gone, /*fromStandby=*/true)) kept.push_back(gone);
    } else if (entries_.count(id) == 0) {  // (listed here already: its holders speak for it)
      expected_[id] = record.holder;
      kept.push_back(wire::GoneId{id, /*deleted=*/false, record.holder});
    }
  }
  // A holder that went before listing its copy here (no connection to this
  // node need have told: its shard moved). A rank wrongly thought gone (a
  // stall) lists its copies again once it hears of the move: it has
  // `graceSeconds` to, before gets of its objects fail.
  std::vector<wire::GoneId> lostNow;
  for (auto& [id, holder] : expected_) {
    const Fate fate = fateOf(holder);
    if (fate == Fate::kAlive || graceTimers_.count(id)) continue;
    wire::GoneId gone{id, /*deleted=*/false, holder, fate == Fate::kLeft};
    if (graceSeconds <= 0) {
      lostNow.push_back(gone);
      continue;
    }
    graceTimers_[id] = loop_.addTimer(graceSeconds, [this, gone] {
      graceTimers_.erase(gone.id);
      loseExpected(gone);
    });
  }
  for (const auto& gone : lostNow) loseExpected(gone);
  return kept;
}

void DirectoryShard::forgetExpected(const std::string& id) {
  expected_.erase(id);
  if (auto timer = graceTimers_.find(id); timer != graceTimers_.end()) {
    loop_.cancelTimer(timer->second);
    graceTimers_.erase(timer);
  }
}

void DirectoryShard::loseExpected(const wire::GoneId& gone) {
  auto x = expected_.find(gone.id);
  if (x == expected_.end() || x->second != gone.lastHolder) return;  // listed, deleted or moved since
  expected_.erase(x);
  adoptGone(gone, /*fromStandby=*/true);
}

bool DirectoryShard::adoptGone(const wire::GoneId& gone, bool fromStandby, std::vector<int>* staleHolders) {
  if (auto entry = entries_.find(gone.id); entry != entries_.end()) {
    // The previous host remembers an id as deleted only while no put has
    // registered it there since. An entry that a put registered here is
    // newer; copies only listed here again after the move are ones that
    // host's drops did not reach.
    if (!gone.deleted || !entry->second.relisted || staleHolders == nullptr) return false;
    for (const auto& holder : entry->second.holders) staleHolders->push_back(holder.first);
    entries_.erase(entry);
  }
  const Gone& now = gone_.remember(gone.id, Gone{.code = gone.deleted ? Code::kDeleted : Code::kPeerFailed,
                             .rank = gone.lastHolder,
                             .left = gone.lastHolderLeft,
                             .fromStandby = fromStandby,
                             .deletedBy = gone.deletedBy});
  tellSubscribers(gone.id);
  // As in lookup(): a reduce's locate waits on for a lost input to be put again.
  failWaiters(gone.id, goneStatus(gone.id, now), /*keepLocates=*/!gone.deleted);
  return true;
}

bool DirectoryShard::takeStandbyHolder(const std::string& id, int holder, bool primary) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.recomputable || it->second.standbyHolder == holder) return false;
  if (!primary && it->second.standbyHolder >= 0) return false;
  it->second.standbyHolder = holder;
  return true;
}

std::vector<std::pair<std::string, int>> DirectoryShard::forgetHolder(int rank, bool left) {
  std::vector<std::pair<std::string, int>> moved;
  std::vector<wire::GoneId> lostWithIt;
  for (const auto& [id, holder] : expected_) {
    if (holder == rank) lostWithIt.push_back(wire::GoneId{id, /*deleted=*/false, rank, left});
  }
  for (const auto& gone : lostWithIt) loseExpected(gone);
  for (auto e = entries_.begin(); e != entries_.end();) {
    DirectoryEntry& entry = e->second;
    auto it = entry.holders.find(rank);
    if (it != entry.holders.end()) {
      if (!it->second.complete && it->second.source >= 0) {
        auto sender = entry.holders.find(it->second.source);
        if (sender != entry.holders.end() && sender->second.serving > 0) sender->second.serving--;
      }
      entry.holders.erase(it);
      if (lost(entry)) {
        e = dropLost(e, rank, left);
        continue;
      }
      if (entry.standbyHolder == rank && !entry.holders.empty()) {
        entry.standbyHolder = anyHolder(entry);
        moved.emplace_back(e->first, entry.standbyHolder);
      }
    }
    ++e;
  }
  for (auto w = watches_.begin(); w != watches_.end();) {
    auto& subscribers = w->second.subscribers;
    subscribers.erase(std::remove_if(subscribers.begin(), subscribers.end(), [rank](const auto& s) { return s.first == rank; }),
                      subscribers.end());
    w = subscribers.empty() ? watches_.erase(w) : std::next(w);
  }
  for (const auto& watch : watches_) tellSubscribers(watch.first);  // changes no watch list
  return moved;
}

void DirectoryShard::subscribe(const std::string& id, int rank, uint64_t request) {
  Watch& watch = watches_[id];
  const std::pair<int, uint64_t> subscriber(rank, request);
  if (std::find(watch.subscribers.begin(), watch.subscribers.end(), subscriber) == watch.subscribers.end()) {
    watch.subscribers.push_back(subscriber);
  }
  wire::Locations now = locationsOf(id);
  watch.told = wire::encode(now);
  now.request = request;
  publish_(rank, now);
}

void DirectoryShard::unsubscribe(const std::string& id, int rank, uint64_t request) {
  auto w = watches_.find(id);
  if (w == watches_.end()) return;
  auto& subscribers = w->second.subscribers;
  subscribers.erase(std::remove(subscribers.begin(), subscribers.end(), std::make_pair(rank, request)), subscribers.end());
  if (subscribers.empty()) watches_.erase(w);
}

wire::Locations DirectoryShard::locationsOf(const std::string& id) const {
  wire::Locations loc;
  loc.id = id;
  if (auto it = entries_.find(id); it != entries_.end()) {
    loc.state = wire::LocationState::kPresent;
    for (const auto& [rank, holder] : it->second.holders) (holder.complete ? loc.complete : loc.partial).push_back(rank);
    loc.inlined = it->second.hasInline;
  } else if (const Gone* gone = gone_.find(id); gone != nullptr && !gone->failedReduce) {
    loc.state = gone->code == Code::kDeleted ? wire::LocationState::kDeleted : wire::LocationState::kLost;
    loc.lastHolder = gone->rank;
  }
  return loc;
}

void DirectoryShard::tellSubscribers(const std::string& id) {
  auto w = watches_.find(id);
  if (w == watches_.end()) return;
  wire::Locations now = locationsOf(id);
  std::string encoded = wire::encode(now);
  if (encoded == w->second.told) return;
  w->second.told = std::move(encoded);
  for (const auto& [rank, request] : w->second.subscribers) {
    now.request = request;
    publish_(rank, now);
  }
}

Status DirectoryShard::remove(const std::string& id, bool retract, std::vector<int>* holders, uint64_t ifToken,
                              uint64_t deleteToken) {
  auto it = entries_.find(id);
  if (it != entries_.end() && ifToken != 0 && it->second.token != 0 && it->second.token != ifToken) {
    return Status(Code::kAlreadyExists, "object " + printableId(id) + " was registered again since");
  }
  auto expected = expected_.find(id);
  // Put, and its holder has not listed its copy here since this node took the
  // share over: deleted as below, and that holder drops its copy, so that
  // listing it later cannot bring the object back.
  const bool deletesExpected = it == entries_.end() && expected != expected_.end() && !retract && ifToken == 0;
  if (it == entries_.end() && !deletesExpected) {
    // Retracted (or a cleanup of a reduce's result, whose token the standby
    // does not know) before its holder listed it here.
    forgetExpected(id);
    if (Gone* gone = gone_.find(id); gone != nullptr && gone->code == Code::kDeleted) {
      if (deleteToken != 0 && gone->deletedBy == deleteToken) {
        // This delete, asked again. Holders the first host could not reach
        // before it died must not bring the object back by listing it.
        gone->fromStandby = false;
        return Status();
      }
      return Status(Code::kDeleted, "object " + printableId(id) + " was already deleted");
    }
    if (const Gone* gone = gone_.find(id); gone != nullptr && !gone->failedReduce && !retract && ifToken == 0) {
      // Lost with its holders: the caller's delete stands all the same, so a
      // holder only taken for failed that lists its copy again loses it.
      gone_.remember(id, Gone{.code = Code::kDeleted, .deletedBy = deleteToken});
      return Status();
    }
    return Status(Code::kNotFound, "object " + printableId(id) + " does not exist");
  }
  if (deletesExpected) {
    holders->push_back(expected->second);
    forgetExpected(id);
  } else {
    for (const auto& holder : it->second.holders) holders->push_back(holder.first);
    entries_.erase(it);
  }
  if (!retract) gone_.remember(id, Gone{.code = Code::kDeleted, .deletedBy = deleteToken});
  tellSubscribers(id);
  return Status();
}

DirectoryShard::Entries::iterator DirectoryShard::dropLost(Entries::iterator entry, int lastHolder, bool left) {
  // A reduce's result is computed again: its readers wait for it.
  if (!entry->second.recomputable) {
    gone_.remember(entry->first, Gone{.code = Code::kPeerFailed, .rank = lastHolder, .left = left});
  }
  return entries_.erase(entry);
}

Status DirectoryShard::goneStatus(const std::string& id, const Gone& gone) {
  if (gone.failedReduce) return Status(gone.code, "object " + printableId(id) + " was not computed: " + gone.why);
  if (gone.code == Code::kDeleted) {
    return Status(Code::kDeleted, "object " + printableId(id) + " was deleted" + (gone.why.empty() ? "" : ": " + gone.why));
  }
  if (gone.rank < 0) return Status(gone.code, "object " + printableId(id) + " was lost: no copy of it is left");
  return Status(gone.code, "object " + printableId(id) + " was lost: its last holder, rank " + std::to_string(gone.rank) +
                               (gone.left ? ", left (it shut down)" : ", failed"));
}


}  // namespace hoplite
