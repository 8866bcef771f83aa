#include "planner/importers.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <cmath>
#include <map>
#include <queue>
#include <set>
#include <tuple>

#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "planner/gpt_profile.h"

namespace tandem::planner {
namespace {

constexpr double kMillisecondsPerSecond = 1000.0;
constexpr double kBytesPerMegabyte = 1024.0 * 1024.0;
// Mixed-precision Adam: fp32 master weights and two fp32 moments per fp16 weight, six times
// the fp16 weight bytes; with weights and gradients, eight times in all.
constexpr double kAdamStateBytesPerWeightByte = 6.0;
constexpr double kStaticBytesPerWeightByte = 8.0;
// Formats that give forward plus backward only: backward is taken as twice the forward.
constexpr double kForwardShare = 1.0 / 3.0;

absl::Status Invalid(absl::string_view where, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", problem));
}

std::string Stem(absl::string_view path) {
  size_t slash = path.rfind('/');
  absl::string_view base = slash == absl::string_view::npos ? path : path.substr(slash + 1);
  size_t dot = base.find('.');
  return std::string(dot == absl::string_view::npos ? base : base.substr(0, dot));
}

// ---- PipeDream graph.txt -----------------------------------------------------------------

struct GraphNode {
  std::string id;
  std::string description;
  double forward_ms = 0, backward_ms = 0, activation_bytes = 0, parameter_bytes = 0;
  int line = 0;
};

absl::StatusOr<double> ParseGraphValue(absl::string_view value, absl::string_view where) {
  value = absl::StripAsciiWhitespace(value);
  double total = 0;
  if (absl::ConsumePrefix(&value, "[")) {
    if (!absl::ConsumeSuffix(&value, "]")) return Invalid(where, "unterminated '['");
    for (absl::string_view part : absl::StrSplit(value, ';')) {
      double d;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part), &d)) {
        return Invalid(where, absl::StrCat("not a number: '", part, "'"));
      }
      total += d;
    }
  } else if (!absl::SimpleAtod(value, &total)) {
    return Invalid(where, absl::StrCat("not a number: '", value, "'"));
  }
  if (!std::isfinite(total)) return Invalid(where, "must be finite");
  if (total < 0) return Invalid(where, absl::StrCat("must not be negative (got ", total, ")"));
  return total;
}

absl::StatusOr<GraphNode> ParseNodeLine(absl::string_view line, absl::string_view where) {
  const size_t first = line.find(" -- ");
  const size_t last = line.rfind(" -- ");
  if (first == absl::string_view::npos || last == first) {
    return Invalid(where, "expected 'nodeN -- description -- key=value, ...'");
  }
  GraphNode node;
  node.id = std::string(absl::StripAsciiWhitespace(line.substr(0, first)));
  node.description = std::string(line.substr(first + 4, last - first - 4));
  absl::string_view metadata = line.substr(last + 4);
  std::map<std::string, std::string> fields;
  // Values may be "[a; b]": split on commas outside brackets.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= metadata.size(); ++i) {
    const char c = i < metadata.size() ? metadata[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      absl::string_view item = absl::StripAsciiWhitespace(metadata.substr(start, i - start));
      start = i + 1;
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == absl::string_view::npos) {
        return Invalid(where, absl::StrCat("expected key=value, got '", item, "'"));
      }
      fields[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
    }
  }
  struct Field {
    const char* name;
    double* value;
  };
  for (Field f : {Field{"forward_compute_time", &node.forward_ms},
                  Field{"backward_compute_time", &node.backward_ms},
                  Field{"activation_size", &node.activation_bytes},
                  Field{"parameter_size", &node.parameter_bytes}}) {
    auto it = fields.find(f.name);
    const std::string field_where = absl::StrCat(where, ": ", node.id, ".", f.name);
    if (it == fields.end()) return Invalid(field_where, "missing field");
    TANDEM_ASSIGN_OR_RETURN(*f.value, ParseGraphValue(it->second, field_where));
  }
  return node;
}

// "node12" -> 12; otherwise -1.
int64_t NumericSuffix(const std::string& id) {
  size_t i = id.size();
  while (i > 0 && absl::ascii_isdigit(id[i - 1])) --i;
  int64_t n;
  if (i == id.size() || !absl::SimpleAtoi(id.substr(i), &n)) return -1;
  return n;
}

// ---- Piper JSON ---------------------------------------------------------------------------

absl::StatusOr<std::map<int, double>> GetSyncMap(const nlohmann::json& j, absl::string_view field,
                                                 absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* object, GetObject(j, field, where));
  std::map<int, double> out;
  for (auto it = object->begin(); it != object->end(); ++it) {
    int64_t key;
    const std::string key_where = absl::StrCat(where, ".", field, ".", it.key());
    if (!absl::SimpleAtoi(it.key(), &key)) return Invalid(key_where, "key is not a node id");
    if (!it.value().is_number() || !std::isfinite(it.value().get<double>())) {
      return Invalid(key_where, "expected a number");
    }
    if (it.value().get<double>() < 0) return Invalid(key_where, "must not be negative");
    out[static_cast<int>(key)] = it.value().get<double>();
  }
  return out;
}

absl::StatusOr<PiperConfig> ParsePiperConfig(const nlohmann::json& j, absl::string_view where) {
  PiperConfig c;
  TANDEM_ASSIGN_OR_RETURN(c.id, GetString(j, "id", where));
  if (c.id.empty()) return Invalid(absl::StrCat(where, ".id"), "must not be empty");
  TANDEM_ASSIGN_OR_RETURN(c.time_per_sample, GetNonNegativeNumber(j, "timePerSample", where));
  TANDEM_ASSIGN_OR_RETURN(c.parameter_bytes, GetNonNegativeNumber(j, "parameterSize", where));
  TANDEM_ASSIGN_OR_RETURN(c.memory_per_microbatch_bytes,
                          GetNonNegativeNumber(j, "memoryUsageA", where));
  TANDEM_ASSIGN_OR_RETURN(c.memory_fixed_bytes, GetNonNegativeNumber(j, "memoryUsageB", where));
  TANDEM_ASSIGN_OR_RETURN(c.sync_forward_bytes, GetSyncMap(j, "syncTimeFw", where));
  TANDEM_ASSIGN_OR_RETURN(c.sync_backward_bytes, GetSyncMap(j, "syncTimeBw", where));
  return c;
}

}  // namespace

absl::StatusOr<std::vector<int>> LateTopologicalOrder(
    int num_nodes, const std::vector<std::pair<int, int>>& edges,
    const std::vector<int64_t>& priority, const std::vector<std::string>& names,
    absl::string_view source) {
  std::vector<int> unplaced_successors(num_nodes, 0);
  std::vector<std::vector<int>> predecessors(num_nodes);
  for (const auto& [from, to] : edges) {
    ++unplaced_successors[from];
    predecessors[to].push_back(from);
  }
  // Max-heap on (priority, index): the highest is placed last.
  std::priority_queue<std::pair<int64_t, int>> ready;
  for (int v = 0; v < num_nodes; ++v) {
    if (unplaced_successors[v] == 0) ready.push({priority[v], v});
  }
  std::vector<int> reversed;
  reversed.reserve(num_nodes);
  while (!ready.empty()) {
    const int v = ready.top().second;
    ready.pop();
    reversed.push_back(v);
    for (int u : predecessors[v]) {
      if (--unplaced_successors[u] == 0) ready.push({priority[u], u});
    }
  }
  if (static_cast<int>(reversed.size()) != num_nodes) {
    std::vector<std::string> stuck;
    for (int v = 0; v < num_nodes && stuck.size() < 5; ++v) {
      if (unplaced_successors[v] > 0) stuck.push_back(names[v]);
    }
    return Invalid(source, absl::StrCat("the graph has a cycle (involving ",
                                        absl::StrJoin(stuck, ", "),
                                        stuck.size() == 5 ? ", ...)" : ")"));
  }
  std::reverse(reversed.begin(), reversed.end());
  return reversed;
}

absl::StatusOr<pipeline::Profile> ImportPipeDreamGraph(absl::string_view text,
                                                       absl::string_view source,
                                                       PipeDreamGraph* graph) {
  std::vector<GraphNode> nodes;
  std::map<std::string, int> index_of;
  struct PendingEdge {
    std::string from, to;
    int line;
  };
  std::vector<PendingEdge> pending;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat(source, ":", line_number);
    if (line[0] == '\t' || line[0] == ' ') {
      std::vector<std::string> ends = absl::StrSplit(absl::StripAsciiWhitespace(line), " -- ");
      if (ends.size() != 2 || ends[0].empty() || ends[1].empty()) {
        return Invalid(where, "expected an edge 'nodeA -- nodeB'");
      }
      pending.push_back({ends[0], ends[1], line_number});
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(GraphNode node, ParseNodeLine(line, where));
    node.line = line_number;
    if (index_of.count(node.id)) {
      return Invalid(where, absl::StrCat("node '", node.id, "' is defined twice"));
    }
    index_of[node.id] = static_cast<int>(nodes.size());
    nodes.push_back(std::move(node));
  }
  if (nodes.empty()) return Invalid(source, "no nodes (is this a PipeDream graph.txt?)");
  std::vector<std::pair<int, int>> edges;
  std::set<std::pair<int, int>> seen_edges;
  for (const PendingEdge& e : pending) {
    const std::string where = absl::StrCat(source, ":", e.line);
    auto from = index_of.find(e.from);
    auto to = index_of.find(e.to);
    if (from == index_of.end() || to == index_of.end()) {
      return Invalid(where, absl::StrCat("edge refers to unknown node '",
                                         from == index_of.end() ? e.from : e.to, "'"));
    }
    if (from->second == to->second) {
      return Invalid(where, absl::StrCat("the graph has a cycle (involving ", e.from, ")"));
    }
    if (seen_edges.insert({from->second, to->second}).second) {
      edges.push_back({from->second, to->second});
    }
  }
  const int n = static_cast<int>(nodes.size());
  std::vector<int> in_degree(n, 0), out_degree(n, 0);
  for (const auto& [from, to] : edges) {
    ++out_degree[from];
    ++in_degree[to];
  }
  // As PipeDream's optimizer: "__getitem__" sinks go, "Input" sources carry no work.
  std::vector<bool> dropped(n, false), input_source(n, false);
  for (int v = 0; v < n; ++v) {
    if (out_degree[v] == 0 && absl::StartsWith(nodes[v].description, "__getitem__")) {
      dropped[v] = true;
    }
    if (in_degree[v] == 0 && absl::StartsWith(nodes[v].description, "Input")) {
      nodes[v].forward_ms = nodes[v].backward_ms = 0;
      nodes[v].activation_bytes = nodes[v].parameter_bytes = 0;
      input_source[v] = true;
    }
  }
  std::vector<int> kept_index(n, -1);
  std::vector<int> kept;
  for (int v = 0; v < n; ++v) {
    if (!dropped[v]) {
      kept_index[v] = static_cast<int>(kept.size());
      kept.push_back(v);
    }
  }
  std::vector<std::pair<int, int>> kept_edges;
  for (const auto& [from, to] : edges) {
    if (!dropped[from] && !dropped[to]) kept_edges.push_back({kept_index[from], kept_index[to]});
  }
  std::vector<int64_t> priority;
  std::vector<std::string> names;
  for (int v : kept) {
    const int64_t number = NumericSuffix(nodes[v].id);
    priority.push_back(number >= 0 ? number : nodes[v].line);
    names.push_back(nodes[v].id);
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<int> order,
                          LateTopologicalOrder(static_cast<int>(kept.size()), kept_edges,
                                               priority, names, source));
  std::vector<int> position(kept.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  std::vector<std::vector<int>> inputs(kept.size());
  for (const auto& [from, to] : kept_edges) inputs[position[to]].push_back(position[from]);

  pipeline::Profile profile;
  profile.model = Stem(source);
  profile.microbatch_size = 1;
  profile.device = "imported from PipeDream graph.txt";
  for (size_t i = 0; i < order.size(); ++i) {
    const GraphNode& node = nodes[kept[order[i]]];
    pipeline::LayerProfile layer;
    layer.name = node.id;
    layer.forward_seconds = node.forward_ms / kMillisecondsPerSecond;
    layer.backward_seconds = node.backward_ms / kMillisecondsPerSecond;
    layer.output_activation_bytes = node.activation_bytes;
    layer.stashed_activation_bytes = node.activation_bytes;
    layer.parameter_bytes = node.parameter_bytes;
    layer.recompute_seconds = layer.forward_seconds;
    std::vector<int>& in = inputs[i];
    std::sort(in.begin(), in.end());
    // Recomputing a layer keeps its inputs.
    for (int u : in) layer.recompute_stashed_bytes += nodes[kept[order[u]]].activation_bytes;
    const bool chain_input =
        in.empty() || (in.size() == 1 && in[0] == static_cast<int>(i) - 1);
    if (!chain_input) layer.inputs = in;
    profile.layers.push_back(std::move(layer));
  }
  TANDEM_RETURN_IF_ERROR(pipeline::ValidateProfile(profile, source));
  if (graph != nullptr) {
    // PipeDream's view: input nodes removed, its states starting from the first remaining
    // source in the file.
    graph->inputs.assign(order.size(), {});
    graph->ignored.assign(order.size(), false);
    int first_line = std::numeric_limits<int>::max();
    graph->start_layer = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      graph->ignored[i] = input_source[kept[order[i]]];
    }
    for (size_t i = 0; i < order.size(); ++i) {
      if (graph->ignored[i]) continue;
      for (int u : inputs[i]) {
        if (!graph->ignored[u]) graph->inputs[i].push_back(u);
      }
      const int line = nodes[kept[order[i]]].line;
      if (graph->inputs[i].empty() && line < first_line) {
        first_line = line;
        graph->start_layer = static_cast<int>(i);
      }
    }
  }
  return profile;
}

absl::StatusOr<pipeline::Profile> ReadPipeDreamGraphFile(const std::string& path,
                                                         PipeDreamGraph* graph) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ImportPipeDreamGraph(text, path, graph);
}

absl::Status ValidatePiperInstance(const PiperInstance& instance, absl::string_view source) {
  const int n = static_cast<int>(instance.nodes.size());
  if (n == 0) return Invalid(source, "nodes: no nodes");
  if (instance.max_devices < 1) return Invalid(source, "maxDevices: must be at least 1");
  if (!(instance.bandwidth_bytes_per_second > 0)) {
    return Invalid(source, "bandwidth: must be positive");
  }
  if (!(instance.memory_per_device_bytes > 0)) {
    return Invalid(source, "maxMemoryPerDevice: must be positive");
  }
  if (instance.microbatches_per_batch < 1) {
    return Invalid(source, "mbsInBatch: must be at least 1");
  }
  std::vector<std::pair<int, int>> edge_set;  // sorted below
  edge_set.reserve(instance.edges.size());
  for (size_t e = 0; e < instance.edges.size(); ++e) {
    const PiperEdge& edge = instance.edges[e];
    if (edge.source < 0 || edge.destination >= n || edge.source >= edge.destination) {
      return Invalid(source, absl::StrCat("edges[", e,
                                          "]: must go from an earlier node to a later one (",
                                          edge.source, " -> ", edge.destination, ")"));
    }
    if (!(edge.bytes >= 0)) return Invalid(source, absl::StrCat("edges[", e, "]: negative cost"));
    edge_set.push_back({edge.source, edge.destination});
  }
  std::sort(edge_set.begin(), edge_set.end());
  auto has_edge = [&](int from, int to) {
    return std::binary_search(edge_set.begin(), edge_set.end(), std::make_pair(from, to));
  };
  for (int v = 0; v < n; ++v) {
    if (!instance.nodes[v].configs.count(1) || instance.nodes[v].configs.at(1).empty()) {
      return Invalid(source, absl::StrCat("nodes[", v, "]: no configuration for degree 1"));
    }
    for (const auto& [degree, configs] : instance.nodes[v].configs) {
      if (degree < 1) return Invalid(source, absl::StrCat("nodes[", v, "]: degree ", degree));
      for (const PiperConfig& c : configs) {
        for (const auto& [u, bytes] : c.sync_forward_bytes) {
          if (!has_edge(u, v)) {
            return Invalid(source, absl::StrCat("nodes[", v, "] configuration '", c.id,
                                                "': syncTimeFw names node ", u,
                                                ", which has no edge into it"));
          }
        }
        for (const auto& [w, bytes] : c.sync_backward_bytes) {
          if (!has_edge(v, w)) {
            return Invalid(source, absl::StrCat("nodes[", v, "] configuration '", c.id,
                                                "': syncTimeBw names node ", w,
                                                ", which has no edge from it"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// A Piper file as read: nodes in file order, sync maps keyed by node id, edges by index.
struct RawPiper {
  PiperInstance instance;
  std::map<int64_t, int> index_of_id;
  std::vector<std::string> names;  // for messages: "name (id 7)" or "node 7"
  std::vector<std::pair<int, int>> edge_pairs;
};

std::string NodeLabel(const std::string& name, int64_t id) {
  return name.empty() ? absl::StrCat("node ", id) : absl::StrCat(name, " (id ", id, ")");
}

// Renumbers the nodes in the linearized order and checks the result.
absl::StatusOr<PiperInstance> FinishPiperImport(RawPiper raw_piper, absl::string_view source);

}  // namespace

absl::StatusOr<PiperInstance> ImportPiperJson(const nlohmann::json& j, absl::string_view source) {
  const std::string top = absl::StrCat(source, ": piper");
  if (!j.is_object()) return Invalid(source, "expected a JSON object");
  RawPiper raw_piper;
  PiperInstance& raw = raw_piper.instance;
  std::map<int64_t, int>& index_of_id = raw_piper.index_of_id;
  std::vector<std::string>& names = raw_piper.names;
  std::vector<std::pair<int, int>>& edge_pairs = raw_piper.edge_pairs;
  TANDEM_ASSIGN_OR_RETURN(int64_t max_devices, GetInt(j, "maxDevices", top));
  if (max_devices < 1 || max_devices > (1 << 20)) {
    return Invalid(absl::StrCat(top, ".maxDevices"), "must be in [1, 1048576]");
  }
  raw.max_devices = static_cast<int>(max_devices);
  TANDEM_ASSIGN_OR_RETURN(raw.memory_per_device_bytes,
                          GetNonNegativeNumber(j, "maxMemoryPerDevice", top));
  TANDEM_ASSIGN_OR_RETURN(raw.bandwidth_bytes_per_second,
                          GetNonNegativeNumber(j, "bandwidth", top));
  TANDEM_ASSIGN_OR_RETURN(int64_t mbs, GetInt(j, "mbsInBatch", top));
  if (mbs < 1 || mbs > (1 << 24)) {
    return Invalid(absl::StrCat(top, ".mbsInBatch"), "must be in [1, 16777216]");
  }
  raw.microbatches_per_batch = static_cast<int>(mbs);

  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* nodes, GetArray(j, "nodes", top));
  for (size_t i = 0; i < nodes->size(); ++i) {
    const nlohmann::json& node_json = (*nodes)[i];
    const std::string where = absl::StrCat(top, ".nodes[", i, "]");
    TANDEM_ASSIGN_OR_RETURN(int64_t id, GetInt(node_json, "id", where));
    if (index_of_id.count(id)) {
      return Invalid(absl::StrCat(where, ".id"), absl::StrCat("node id ", id, " repeats"));
    }
    index_of_id[id] = static_cast<int>(i);
    PiperNode node;
    TANDEM_ASSIGN_OR_RETURN(node.name, GetStringOr(node_json, "name", "", where));
    names.push_back(NodeLabel(node.name, id));
    TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* tmpcs, GetObject(node_json, "TMPCs", where));
    for (auto it = tmpcs->begin(); it != tmpcs->end(); ++it) {
      int64_t degree;
      const std::string degree_where = absl::StrCat(where, ".TMPCs.", it.key());
      if (!absl::SimpleAtoi(it.key(), &degree) || degree < 1 || degree > (1 << 20)) {
        return Invalid(degree_where, "key must be a tensor-parallel degree (a positive integer)");
      }
      if (!it.value().is_array()) return Invalid(degree_where, "expected an array");
      std::set<std::string> config_ids;
      for (size_t k = 0; k < it.value().size(); ++k) {
        const std::string config_where = absl::StrCat(degree_where, "[", k, "]");
        TANDEM_ASSIGN_OR_RETURN(PiperConfig c, ParsePiperConfig(it.value()[k], config_where));
        if (!config_ids.insert(c.id).second) {
          return Invalid(absl::StrCat(config_where, ".id"), absl::StrCat("'", c.id, "' repeats"));
        }
        node.configs[static_cast<int>(degree)].push_back(std::move(c));
      }
    }
    if (!node.configs.count(1) || node.configs[1].empty()) {
      return Invalid(absl::StrCat(where, ".TMPCs"),
                     "needs configurations for tensor-parallel degree 1");
    }
    raw.nodes.push_back(std::move(node));
  }
  if (raw.nodes.empty()) return Invalid(absl::StrCat(top, ".nodes"), "no nodes");
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* edges, GetArray(j, "edges", top));
  std::set<std::pair<int, int>> seen;
  for (size_t e = 0; e < edges->size(); ++e) {
    const std::string where = absl::StrCat(top, ".edges[", e, "]");
    TANDEM_ASSIGN_OR_RETURN(int64_t from, GetInt((*edges)[e], "sourceId", where));
    TANDEM_ASSIGN_OR_RETURN(int64_t to, GetInt((*edges)[e], "destId", where));
    PiperEdge edge;
    TANDEM_ASSIGN_OR_RETURN(edge.bytes,
                            GetNonNegativeNumber((*edges)[e], "communicationCost", where));
    auto f = index_of_id.find(from);
    auto t = index_of_id.find(to);
    if (f == index_of_id.end() || t == index_of_id.end()) {
      return Invalid(where, absl::StrCat("refers to unknown node id ",
                                         f == index_of_id.end() ? from : to));
    }
    if (f->second == t->second) {
      return Invalid(where,
                     absl::StrCat("the graph has a cycle (involving ", names[f->second], ")"));
    }
    if (!seen.insert({f->second, t->second}).second) return Invalid(where, "duplicate edge");
    edge.source = f->second;
    edge.destination = t->second;
    raw.edges.push_back(edge);
    edge_pairs.push_back({f->second, t->second});
  }
  return FinishPiperImport(std::move(raw_piper), source);
}

namespace {

absl::StatusOr<PiperInstance> FinishPiperImport(RawPiper raw_piper, absl::string_view source) {
  const std::string top = absl::StrCat(source, ": piper");
  PiperInstance& raw = raw_piper.instance;
  const std::map<int64_t, int>& index_of_id = raw_piper.index_of_id;
  const int n = static_cast<int>(raw.nodes.size());
  std::vector<int64_t> priority(n);
  for (int v = 0; v < n; ++v) priority[v] = v;
  TANDEM_ASSIGN_OR_RETURN(std::vector<int> order,
                          LateTopologicalOrder(n, raw_piper.edge_pairs, priority,
                                               raw_piper.names, source));
  std::vector<int> position(n);
  for (int i = 0; i < n; ++i) position[order[i]] = i;

  PiperInstance instance;
  instance.max_devices = raw.max_devices;
  instance.memory_per_device_bytes = raw.memory_per_device_bytes;
  instance.bandwidth_bytes_per_second = raw.bandwidth_bytes_per_second;
  instance.microbatches_per_batch = raw.microbatches_per_batch;
  for (int i = 0; i < n; ++i) {
    PiperNode node = std::move(raw.nodes[order[i]]);
    // Sync maps are keyed by node id; rekey them by position (kept when nothing moves).
    auto rekey = [&](std::map<int, double>* sync, absl::string_view field) -> absl::Status {
      bool same = true;
      for (const auto& [id, bytes] : *sync) {
        auto it = index_of_id.find(id);
        if (it == index_of_id.end()) {
          return Invalid(absl::StrCat(top, ".nodes[", order[i], "]"),
                         absl::StrCat(field, " names unknown node id ", id));
        }
        same = same && position[it->second] == id;
      }
      if (same) return absl::OkStatus();
      std::map<int, double> rekeyed;
      for (const auto& [id, bytes] : *sync) {
        rekeyed.insert_or_assign(rekeyed.end(), position[index_of_id.at(id)], bytes);
      }
      *sync = std::move(rekeyed);
      return absl::OkStatus();
    };
    for (auto& [degree, configs] : node.configs) {
      for (PiperConfig& c : configs) {
        TANDEM_RETURN_IF_ERROR(rekey(&c.sync_forward_bytes, "syncTimeFw"));
        TANDEM_RETURN_IF_ERROR(rekey(&c.sync_backward_bytes, "syncTimeBw"));
      }
    }
    instance.nodes.push_back(std::move(node));
  }
  for (PiperEdge edge : raw.edges) {
    edge.source = position[edge.source];
    edge.destination = position[edge.destination];
    instance.edges.push_back(edge);
  }
  std::sort(instance.edges.begin(), instance.edges.end(),
            [](const PiperEdge& a, const PiperEdge& b) {
              return std::tie(a.destination, a.source) < std::tie(b.destination, b.source);
            });
  TANDEM_RETURN_IF_ERROR(ValidatePiperInstance(instance, source));
  return instance;
}


// A direct reader for well-formed Piper files: the JSON document costs more than the plan on
// small problems. It accepts a strict subset (no escapes or non-ASCII bytes in strings, no
// repeated keys, integers where ids and counts are due) and applies every check of
// ImportPiperJson; on anything else it gives up (nullopt) and the caller takes the document
// path, so results and messages are the same either way.
class PiperTextReader {
 public:
  explicit PiperTextReader(absl::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  std::optional<RawPiper> Read() {
    RawPiper raw;
    bool have_devices = false, have_memory = false, have_bandwidth = false, have_mbs = false;
    bool have_nodes = false, have_edges = false;
    std::vector<std::tuple<int64_t, int64_t, double>> edges;
    const bool ok = Object([&](absl::string_view key) {
      PiperInstance& in = raw.instance;
      if (key == "maxDevices") {
        int64_t v = 0;
        have_devices = Int(&v) && v >= 1 && v <= (1 << 20);
        in.max_devices = static_cast<int>(v);
        return have_devices;
      }
      if (key == "maxMemoryPerDevice") return have_memory = NonNegative(&in.memory_per_device_bytes);
      if (key == "bandwidth") return have_bandwidth = NonNegative(&in.bandwidth_bytes_per_second);
      if (key == "mbsInBatch") {
        int64_t v = 0;
        have_mbs = Int(&v) && v >= 1 && v <= (1 << 24);
        in.microbatches_per_batch = static_cast<int>(v);
        return have_mbs;
      }
      if (key == "nodes") return have_nodes = Array([&] { return Node(&raw); });
      if (key == "edges") {
        return have_edges = Array([&] {
          int64_t from = 0, to = 0;
          double bytes = 0;
          bool f = false, t = false, c = false;
          return Object([&](absl::string_view k) {
                   if (k == "sourceId") return f = Int(&from);
                   if (k == "destId") return t = Int(&to);
                   if (k == "communicationCost") return c = NonNegative(&bytes);
                   return Skip();
                 }) &&
                 f && t && c && (edges.emplace_back(from, to, bytes), true);
        });
      }
      return Skip();
    });
    SkipSpace();
    if (!ok || p_ != end_ || !have_devices || !have_memory || !have_bandwidth || !have_mbs ||
        !have_nodes || !have_edges || raw.instance.nodes.empty()) {
      return std::nullopt;
    }
    std::set<std::pair<int, int>> seen;
    for (const auto& [from, to, bytes] : edges) {
      auto f = raw.index_of_id.find(from);
      auto t = raw.index_of_id.find(to);
      if (f == raw.index_of_id.end() || t == raw.index_of_id.end() || f->second == t->second ||
          !seen.insert({f->second, t->second}).second) {
        return std::nullopt;
      }
      PiperEdge edge;
      edge.source = f->second;
      edge.destination = t->second;
      edge.bytes = bytes;
      raw.instance.edges.push_back(edge);
      raw.edge_pairs.push_back({f->second, t->second});
    }
    return raw;
  }

 private:
  bool Node(RawPiper* raw) {
    PiperNode node;
    int64_t id = 0;
    bool have_id = false, have_configs = false;
    const bool ok = Object([&](absl::string_view key) {
      if (key == "id") return have_id = Int(&id);
      if (key == "name") return String(&node.name);
      if (key == "TMPCs") {
        have_configs = true;
        return Object([&](absl::string_view degree_key) {
          int64_t degree;
          if (!Digits(degree_key, &degree) || degree < 1 || degree > (1 << 20)) return false;
          std::vector<PiperConfig>& configs = node.configs[static_cast<int>(degree)];
          std::set<std::string> ids;
          return Array([&] {
            PiperConfig c;
            if (!Config(&c) || !ids.insert(c.id).second) return false;
            configs.push_back(std::move(c));
            return true;
          });
        });
      }
      return Skip();
    });
    if (!ok || !have_id || !have_configs || raw->index_of_id.count(id) ||
        !node.configs.count(1) || node.configs[1].empty()) {
      return false;
    }
    raw->index_of_id[id] = static_cast<int>(raw->instance.nodes.size());
    raw->names.push_back(NodeLabel(node.name, id));
    raw->instance.nodes.push_back(std::move(node));
    return true;
  }

  bool Config(PiperConfig* c) {
    int have = 0;
    auto sync = [&](std::map<int, double>* out) {
      return Object([&](absl::string_view key) {
        int64_t node;
        double bytes;
        if (!Digits(key, &node) || node > std::numeric_limits<int>::max() ||
            !NonNegative(&bytes)) {
          return false;
        }
        out->insert_or_assign(out->end(), static_cast<int>(node), bytes);  // keys mostly ascend
        return true;
      });
    };
    const bool ok = Object([&](absl::string_view key) {
      if (key == "id") return ++have, String(&c->id) && !c->id.empty();
      if (key == "timePerSample") return ++have, NonNegative(&c->time_per_sample);
      if (key == "parameterSize") return ++have, NonNegative(&c->parameter_bytes);
      if (key == "memoryUsageA") return ++have, NonNegative(&c->memory_per_microbatch_bytes);
      if (key == "memoryUsageB") return ++have, NonNegative(&c->memory_fixed_bytes);
      if (key == "syncTimeFw") return ++have, sync(&c->sync_forward_bytes);
      if (key == "syncTimeBw") return ++have, sync(&c->sync_backward_bytes);
      return Skip();
    });
    return ok && have == 7;
  }

  void SkipSpace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // Calls member(key) with the reader at each value; repeated keys are refused.
  template <typename Member>
  bool Object(Member member) {
    // Deeper than any JSON tandem reads (common/json_util.h): refused here, named by ParseJson.
    if (depth_ >= kMaxJsonDepth || !Eat('{')) return false;
    ++depth_;
    const bool read = ObjectMembers(member);
    --depth_;
    return read;
  }
  template <typename Member>
  bool ObjectMembers(Member member) {
    if (Eat('}')) return true;
    absl::InlinedVector<absl::string_view, 8> keys;
    do {
      absl::string_view key;
      if (!View(&key) || std::find(keys.begin(), keys.end(), key) != keys.end() || !Eat(':') ||
          !member(key)) {
        return false;
      }
      keys.push_back(key);
    } while (Eat(','));
    return Eat('}');
  }
  template <typename Element>
  bool Array(Element element) {
    if (depth_ >= kMaxJsonDepth || !Eat('[')) return false;
    ++depth_;
    const bool read = [&] {
      if (Eat(']')) return true;
      do {
        if (!element()) return false;
      } while (Eat(','));
      return Eat(']');
    }();
    --depth_;
    return read;
  }
  // A string without escapes, as a view of the text.
  bool View(absl::string_view* out) {
    if (!Eat('"')) return false;
    const char* start = p_;
    while (p_ != end_ && *p_ != '"') {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
      ++p_;
    }
    if (p_ == end_) return false;
    *out = absl::string_view(start, p_ - start);
    ++p_;
    return true;
  }
  bool String(std::string* out) {
    absl::string_view view;
    if (!View(&view)) return false;
    out->assign(view.data(), view.size());
    return true;
  }
  // A JSON number token; `integer` tells whether it has no fraction or exponent.
  bool Number(absl::string_view* token, bool* integer) {
    SkipSpace();
    const char* start = p_;
    if (p_ != end_ && *p_ == '-') ++p_;
    if (p_ == end_ || !absl::ascii_isdigit(*p_)) return false;
    if (*p_ == '0') {
      ++p_;
    } else {
      while (p_ != end_ && absl::ascii_isdigit(*p_)) ++p_;
    }
    *integer = true;
    if (p_ != end_ && *p_ == '.') {
      *integer = false;
      ++p_;
      if (p_ == end_ || !absl::ascii_isdigit(*p_)) return false;
      while (p_ != end_ && absl::ascii_isdigit(*p_)) ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      *integer = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !absl::ascii_isdigit(*p_)) return false;
      while (p_ != end_ && absl::ascii_isdigit(*p_)) ++p_;
    }
    *token = absl::string_view(start, p_ - start);
    return true;
  }
  bool Int(int64_t* out) {
    absl::string_view token;
    bool integer;
    if (!Number(&token, &integer) || !integer || token.size() > 15) return false;
    return std::from_chars(token.data(), token.data() + token.size(), *out).ec == std::errc();
  }
  // A finite number >= 0, rounded as nlohmann (strtod) rounds it.
  bool NonNegative(double* out) {
    absl::string_view token;
    bool integer;
    if (!Number(&token, &integer)) return false;
    const auto result = std::from_chars(token.data(), token.data() + token.size(), *out);
    return result.ec == std::errc() && std::isfinite(*out) && *out >= 0;
  }
  // A key made of decimal digits only (no sign), at most 15 of them.
  static bool Digits(absl::string_view key, int64_t* out) {
    if (key.empty() || key.size() > 15) return false;
    for (char c : key) {
      if (!absl::ascii_isdigit(c)) return false;
    }
    return std::from_chars(key.data(), key.data() + key.size(), *out).ec == std::errc();
  }
  // Any JSON value, unread.
  bool Skip() {
    SkipSpace();
    if (p_ == end_) return false;
    switch (*p_) {
      case '{':
        return Object([&](absl::string_view) { return Skip(); });
      case '[':
        return Array([&] { return Skip(); });
      case '"': {
        absl::string_view ignored;
        return View(&ignored);
      }
      case 't':
        return Literal("true");
      case 'f':
        return Literal("false");
      case 'n':
        return Literal("null");
      default: {
        absl::string_view token;
        bool integer;
        return Number(&token, &integer);
      }
    }
  }
  bool Literal(absl::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size() ||
        absl::string_view(p_, word.size()) != word) {
      return false;
    }
    p_ += word.size();
    return true;
  }

  const char* p_;
  const char* end_;
  int depth_ = 0;  // arrays and objects open
};

std::optional<RawPiper> ReadPiperText(absl::string_view text) {
  return PiperTextReader(text).Read();
}

}  // namespace

absl::StatusOr<PiperInstance> ReadPiperFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  // Well-formed files take the direct reader; anything it does not accept goes through the
  // JSON document and ImportPiperJson, which names what is wrong.
  if (std::optional<RawPiper> raw = ReadPiperText(text); raw.has_value()) {
    return FinishPiperImport(std::move(*raw), path);
  }
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, path));
  return ImportPiperJson(j, path);
}

PiperInstance PiperFromProfile(const pipeline::Profile& profile,
                               const PiperProblemSettings& settings) {
  PiperInstance instance;
  instance.max_devices = settings.max_devices;
  instance.memory_per_device_bytes = settings.memory_per_device_bytes;
  instance.bandwidth_bytes_per_second = settings.bandwidth_bytes_per_second;
  instance.microbatches_per_batch = settings.microbatches_per_batch;
  const int n = static_cast<int>(profile.layers.size());
  for (int v = 0; v < n; ++v) {
    const pipeline::LayerProfile& layer = profile.layers[v];
    PiperNode node;
    node.name = layer.name;
    auto add_configs = [&](int degree, double seconds, double parameters, double stashed,
                           double optimizer, double recompute_seconds,
                           double recompute_stashed) {
      std::vector<PiperConfig>& configs = node.configs[degree];
      PiperConfig vanilla;
      vanilla.id = "vanilla";
      vanilla.time_per_sample = seconds;
      vanilla.parameter_bytes = parameters;
      vanilla.memory_per_microbatch_bytes = stashed;
      vanilla.memory_fixed_bytes = 2 * parameters + optimizer;
      configs.push_back(vanilla);
      if (recompute_stashed < stashed) {
        PiperConfig recompute = vanilla;
        recompute.id = "activation recomp";
        recompute.time_per_sample = seconds + recompute_seconds;
        recompute.memory_per_microbatch_bytes = recompute_stashed;
        configs.push_back(recompute);
      }
    };
    add_configs(1, layer.forward_seconds + layer.backward_seconds, layer.parameter_bytes,
                layer.stashed_activation_bytes, layer.optimizer_state_bytes,
                layer.recompute_seconds, layer.recompute_stashed_bytes);
    // Piper weighs one variant per degree (with and without recomputation): where a degree is
    // listed without and with sequence parallelism (as `tandem profile --tensor-parallel`
    // measures it), the one without, since Piper's plans carry no sequence parallelism; a
    // degree listed only with it is taken as it is.
    std::set<int> plain_degrees;
    for (const pipeline::TensorParallelVariant& variant : layer.tensor_parallel) {
      if (variant.expert_parallel == 1 && !variant.sequence_parallel) {
        plain_degrees.insert(variant.degree);
      }
    }
    for (const pipeline::TensorParallelVariant& variant : layer.tensor_parallel) {
      // Piper chooses a degree per stage; the experts' placement is one for the whole run,
      // which only AdaPipe's plans choose.
      if (variant.expert_parallel != 1) continue;
      if (variant.sequence_parallel && plain_degrees.count(variant.degree) > 0) continue;
      const double parameter_share =
          layer.parameter_bytes > 0 ? variant.parameter_bytes / layer.parameter_bytes : 1.0;
      const double forward_share =
          layer.forward_seconds > 0 ? variant.forward_seconds / layer.forward_seconds : 1.0;
      const double stash_share =
          layer.stashed_activation_bytes > 0
              ? variant.stashed_activation_bytes / layer.stashed_activation_bytes
              : 1.0;
      add_configs(variant.degree,
                  variant.forward_seconds + variant.backward_seconds +
                      variant.communication_seconds,
                  variant.parameter_bytes, variant.stashed_activation_bytes,
                  layer.optimizer_state_bytes * parameter_share,
                  layer.recompute_seconds * forward_share,
                  layer.recompute_stashed_bytes * stash_share);
    }
    instance.nodes.push_back(std::move(node));
    if (layer.inputs.empty()) {
      if (v > 0) {
        instance.edges.push_back({v - 1, v, profile.layers[v - 1].output_activation_bytes});
      }
    } else {
      for (int u : layer.inputs) {
        instance.edges.push_back({u, v, profile.layers[u].output_activation_bytes});
      }
    }
  }
  return instance;
}

absl::StatusOr<pipeline::Profile> ProfileFromPiper(const PiperInstance& instance,
                                                   absl::string_view model) {
  TANDEM_RETURN_IF_ERROR(ValidatePiperInstance(instance, model));
  pipeline::Profile profile;
  profile.model = std::string(model);
  profile.microbatch_size = 1;
  profile.device = "imported from Piper";
  const int n = static_cast<int>(instance.nodes.size());
  std::vector<std::vector<int>> inputs(n);
  std::vector<double> output_bytes(n, 0.0);
  for (const PiperEdge& e : instance.edges) {
    inputs[e.destination].push_back(e.source);
    output_bytes[e.source] = std::max(output_bytes[e.source], e.bytes);
  }
  // The vanilla configuration (else the fastest) and the leanest one.
  auto pick = [](const std::vector<PiperConfig>& configs, const PiperConfig** vanilla,
                 const PiperConfig** lean) {
    *vanilla = &configs[0];
    for (const PiperConfig& c : configs) {
      if (c.id == "vanilla") {
        *vanilla = &c;
        break;
      }
      if (c.time_per_sample < (*vanilla)->time_per_sample) *vanilla = &c;
    }
    *lean = *vanilla;
    for (const PiperConfig& c : configs) {
      if (c.memory_per_microbatch_bytes < (*lean)->memory_per_microbatch_bytes) *lean = &c;
    }
  };
  for (int v = 0; v < n; ++v) {
    const PiperNode& node = instance.nodes[v];
    const PiperConfig *vanilla, *lean;
    pick(node.configs.at(1), &vanilla, &lean);
    pipeline::LayerProfile layer;
    layer.name = absl::StrCat(node.name.empty() ? "node" : node.name, "_", v);
    layer.forward_seconds = vanilla->time_per_sample * kForwardShare;
    layer.backward_seconds = vanilla->time_per_sample - layer.forward_seconds;
    layer.output_activation_bytes = output_bytes[v];
    layer.stashed_activation_bytes = vanilla->memory_per_microbatch_bytes;
    layer.parameter_bytes = vanilla->parameter_bytes;
    layer.optimizer_state_bytes =
        std::max(0.0, vanilla->memory_fixed_bytes - 2 * vanilla->parameter_bytes);
    layer.recompute_seconds = std::max(0.0, lean->time_per_sample - vanilla->time_per_sample);
    layer.recompute_stashed_bytes = lean->memory_per_microbatch_bytes;
    std::sort(inputs[v].begin(), inputs[v].end());
    const bool chain = inputs[v].empty() || (inputs[v].size() == 1 && inputs[v][0] == v - 1);
    if (!chain) layer.inputs = inputs[v];
    for (const auto& [degree, configs] : node.configs) {
      if (degree == 1) continue;
      const PiperConfig *tp_vanilla, *tp_lean;
      pick(configs, &tp_vanilla, &tp_lean);
      pipeline::TensorParallelVariant variant;
      variant.degree = degree;
      variant.forward_seconds = tp_vanilla->time_per_sample * kForwardShare;
      variant.backward_seconds = tp_vanilla->time_per_sample - variant.forward_seconds;
      variant.stashed_activation_bytes = tp_vanilla->memory_per_microbatch_bytes;
      variant.parameter_bytes = tp_vanilla->parameter_bytes;
      layer.tensor_parallel.push_back(variant);
    }
    profile.layers.push_back(std::move(layer));
  }
  TANDEM_RETURN_IF_ERROR(pipeline::ValidateProfile(profile, model));
  return profile;
}

absl::StatusOr<pipeline::Profile> ImportMetisJson(const nlohmann::json& j,
                                                  absl::string_view source) {
  const std::string top = absl::StrCat(source, ": metis");
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* model, GetObject(j, "model", top));
  const std::string model_where = absl::StrCat(top, ".model");
  TANDEM_ASSIGN_OR_RETURN(std::string name, GetStringOr(*model, "model_name", "", model_where));
  TANDEM_ASSIGN_OR_RETURN(int64_t num_layers, GetInt(*model, "num_layers", model_where));
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* parameters,
                          GetObject(*model, "parameters", model_where));
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* execution, GetObject(j, "execution_time", top));
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* memory, GetObject(j, "execution_memory", top));
  struct Column {
    const nlohmann::json* object;
    const char* field;
    std::string where;
    std::vector<double> values;
  };
  std::vector<Column> columns = {
      {parameters, "parameters_per_layer_bytes", absl::StrCat(model_where, ".parameters"), {}},
      {execution, "layer_compute_total_ms", absl::StrCat(top, ".execution_time"), {}},
      {memory, "layer_memory_total_mb", absl::StrCat(top, ".execution_memory"), {}}};
  for (Column& c : columns) {
    TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* array, GetArray(*c.object, c.field, c.where));
    if (static_cast<int64_t>(array->size()) != num_layers) {
      return Invalid(absl::StrCat(c.where, ".", c.field),
                     absl::StrCat("expected ", num_layers, " values (num_layers), got ",
                                  array->size()));
    }
    for (size_t i = 0; i < array->size(); ++i) {
      const nlohmann::json& v = (*array)[i];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
        return Invalid(absl::StrCat(c.where, ".", c.field, "[", i, "]"),
                       "expected a non-negative number");
      }
      c.values.push_back(v.get<double>());
    }
  }
  pipeline::Profile profile;
  profile.model = name.empty() ? Stem(source) : name;
  profile.microbatch_size = 1;
  profile.device = "imported from Metis";
  for (int64_t i = 0; i < num_layers; ++i) {
    const double weight_bytes = columns[0].values[i];
    const double compute_seconds = columns[1].values[i] / kMillisecondsPerSecond;
    const double memory_bytes = columns[2].values[i] * kBytesPerMegabyte;
    pipeline::LayerProfile layer;
    layer.name = absl::StrCat("layer", i);
    layer.forward_seconds = compute_seconds * kForwardShare;
    layer.backward_seconds = compute_seconds - layer.forward_seconds;
    layer.parameter_bytes = weight_bytes;
    layer.optimizer_state_bytes = kAdamStateBytesPerWeightByte * weight_bytes;
    layer.stashed_activation_bytes =
        std::max(0.0, memory_bytes - kStaticBytesPerWeightByte * weight_bytes);
    layer.recompute_seconds = layer.forward_seconds;
    profile.layers.push_back(std::move(layer));
  }
  TANDEM_RETURN_IF_ERROR(pipeline::ValidateProfile(profile, source));
  return profile;
}

absl::StatusOr<pipeline::Profile> ReadProfileAs(const std::string& path,
                                                absl::string_view format) {
  if (format == "tandem") return pipeline::ReadProfileFile(path);
  if (format == "pipedream") return ReadPipeDreamGraphFile(path);
  if (format == "piper") {
    TANDEM_ASSIGN_OR_RETURN(PiperInstance instance, ReadPiperFile(path));
    return ProfileFromPiper(instance, Stem(path));
  }
  if (format == "metis") {
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
    return ImportMetisJson(j, path);
  }
  if (format == "builtin") {
    GptShape shape = Gpt3Shape();
    if (path == "gpt3-175b-split") {
      shape.split_blocks = true;
    } else if (path == "gpt3-175b-sp") {
      shape.sequence_parallel = true;
    } else if (path != "gpt3-175b") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown built-in profile '", path,
                       "' (expected gpt3-175b, gpt3-175b-split or gpt3-175b-sp)"));
    }
    return MakeGptProfile(shape, A100Figures());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown profile format '", format,
                   "' (expected tandem, pipedream, piper, metis or builtin)"));
}

}  // namespace tandem::planner
